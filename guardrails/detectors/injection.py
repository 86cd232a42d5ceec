"""Prompt injection and jailbreaks: NanoGuard, a 16.8M-parameter transformer classifier whose
weights ship in the PyPI package ``metatronnanoguard`` (MIT).

Vetted before use (see docs/guardrails-catalogue.md): the package is ~200 lines of plain
PyTorch with no network access; its weights load with ``torch.load(weights_only=True)``. Its
tokenizer, however, is a pickled ``tiktoken.Encoding`` that the package opens with a bare
``pickle.load`` — arbitrary code if the wheel were tampered with. So this module does not call
``NanoGuard()``: it unpickles the tokenizer with an unpickler that admits only that one class,
and loads the weights itself through the package's own ``Classifier.from_checkpoint``.

Inference differs from the package's ``scan`` in two ways. The package pads every text to 512
tokens, and its attention does not mask padding, so pad tokens leak into every score and each
call costs ~0.5 s on one core; this module reads the tokens alone, which is what the
evaluation set measures. A long text is also read passage by passage (see ``_windows``): the
model averages over its tokens, and an instruction buried in a long document would otherwise
be diluted away. The text's score is the highest of its readings.

All readings of a text go through the model in one pass (``injection_model.readings_logits``:
packed rows for the linear layers, a key-padding mask in attention), the same arithmetic as
one unpadded ``Classifier.forward`` per reading, which ``_reference_score`` still runs and
the tests compare against. The model is kept in float32: int8 dynamic quantisation was
measured ~1.5x faster but moved scores by up to 0.28 and flipped two decisions on the
evaluation set (docs/guardrails-catalogue.md).
"""

from __future__ import annotations

import importlib.resources
import io
import pickle  # nosec B403: restricted to one class below
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import regex

from guardrails.base import Finding
from guardrails.detectors import fields, injection_rules

if TYPE_CHECKING:
    import torch

_T = TypeVar("_T")

INJECTION = "injection"
DEFAULT_THRESHOLD = 0.999
_OVERLAP = 64
#: 512-token windows read per text at most (the first and the last: each costs ~0.2 s on one
#: core; the passages cover what lies between)
_MAX_WINDOWS = 2
#: tokens in a passage read on its own, and passages read per text at most
_PASSAGE = 32
_MAX_PASSAGES = 32
_SENTENCE_END = regex.compile(r"(?<=[.!?;:])\s+|\n+")


def _spread(items: list[_T], most: int) -> list[_T]:
    """At most ``most`` of ``items``: the first, the last and evenly between them."""
    if len(items) <= most:
        return items
    last = len(items) - 1
    return [items[round(i * last / (most - 1))] for i in range(most)]


class _EncodingOnly(pickle.Unpickler):
    """Admits ``tiktoken.core.Encoding`` and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("tiktoken.core", "Encoding"):
            from tiktoken.core import Encoding

            return Encoding
        raise pickle.UnpicklingError(f"tokenizer.pkl may not load {module}.{name}")


class PromptInjectionDetector:
    """Instructions that try to override the system prompt, role-play jailbreaks (DAN…),
    smuggled or encoded instructions; score = the classifier's probability."""

    name: ClassVar[str] = "prompt_injection"

    def __init__(self) -> None:
        self._model: torch.nn.Module | None = None
        self._tokenizer: Any = None
        self._window = 512

    def load(self) -> None:
        import torch
        from nanoguard.model import Classifier
        from nanoguard.tokenizer import Tokenizer

        # One thread: the worker pool is the unit of parallelism, and torch's own threads
        # would fight the other workers for the same cores.
        torch.set_num_threads(1)
        assets = importlib.resources.files("nanoguard.assets")
        encoding = _EncodingOnly(io.BytesIO((assets / "tokenizer.pkl").read_bytes())).load()
        self._tokenizer = Tokenizer(encoding)  # type: ignore[no-untyped-call]
        with importlib.resources.as_file(assets / "model.pt") as path:
            model, _metrics, config = Classifier.from_checkpoint(str(path), device="cpu")
        self._model = model
        self._window = int(config.sequence_len)
        self.score("warm up")

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        fields.only(self.name, settings, ("threshold", "classifier"))
        return {
            "threshold": fields.number(settings, "threshold", DEFAULT_THRESHOLD),
            # false: the rules alone (a fraction of a millisecond instead of the classifier's
            # hundreds on a long prompt), for a use case that trades recall for speed
            "classifier": fields.flag(settings, "classifier", True),
        }

    def _windows(self, text: str) -> list[list[int]]:
        """What the model reads: the text itself (in 512-token windows if longer), and, for a
        text of more than a passage, its passages of about a paragraph each. The model
        averages over every token it reads, so one instruction inside a long benign document
        barely moves the whole text's score; read alone, its passage scores as it should."""
        bos = self._tokenizer.bos_token_id
        encode = self._tokenizer.enc.encode_ordinary
        ids: list[int] = encode(text)
        size = self._window - 1
        if len(ids) <= size:
            windows = [ids]
        else:
            step = size - _OVERLAP
            starts = list(range(0, len(ids) - size + step, step))
            windows = [ids[start : start + size] for start in _spread(starts, _MAX_WINDOWS)]
        if len(ids) > _PASSAGE:
            passages: list[list[int]] = [[]]
            for sentence in _SENTENCE_END.split(text):
                tokens = encode(sentence)
                if passages[-1] and len(passages[-1]) + len(tokens) > _PASSAGE:
                    passages.append([])
                passages[-1].extend(tokens)
            pieces = [p[i : i + _PASSAGE] for p in passages for i in range(0, len(p), _PASSAGE)]
            windows += _spread([p for p in pieces if p], _MAX_PASSAGES)
        return [[bos, *window] for window in windows]

    def score(self, text: str) -> float:
        """The highest injection probability over the text's readings, all in one pass."""
        from guardrails.detectors.injection_model import readings_logits

        return self._highest(text, readings_logits)

    def _reference_score(self, text: str) -> float:
        """``score`` the plain way: one unpadded ``Classifier.forward`` per reading (padding
        would leak into the attention, see above). The fast path is checked against it."""
        import torch

        def one_by_one(model: torch.nn.Module, readings: list[list[int]]) -> torch.Tensor:
            return torch.cat(
                [
                    model(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.bool))
                    for r in readings
                ]
            )

        return self._highest(text, one_by_one)

    def _highest(
        self, text: str, logits: Callable[[torch.nn.Module, list[list[int]]], torch.Tensor]
    ) -> float:
        if self._model is None:
            self.load()
        assert self._model is not None
        import torch

        with torch.inference_mode():
            probabilities = torch.softmax(logits(self._model, self._windows(text)).float(), -1)
        return float(probabilities[:, 1].max())

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        """The rules first (guardrails/detectors/injection_rules.py: an attack's shape is a
        finding at 1.0, whatever the threshold); then the classifier, only where its reading
        means something: a text that addresses a model or its instructions, and is not an
        office "ignore my previous e-mail". Off-topic texts (config lines, greetings in other
        languages, emoji) are where it raises false alarms, and skipping them saves its cost."""
        shape, worth_reading = injection_rules.screen(text)
        if shape is not None:
            return [Finding(INJECTION, 1.0)]
        if not worth_reading or not settings.get("classifier", True):
            return []
        score = self.score(text)
        if score < float(settings.get("threshold", DEFAULT_THRESHOLD)):
            return []
        return [Finding(INJECTION, round(score, 4))]
