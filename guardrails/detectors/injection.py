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

How it runs (issue 26: ≤ 15 ms p50 on a 1 KB prompt, one core). The model's arithmetic is
~25 MFLOP per token read, whatever the runtime, so ``check`` reads less, and cheaper:

- the rule layer decides first (an attack's shape is a finding; a text that does not address
  a model, or is an office "ignore my previous e-mail", is not read at all);
- of the rest, the classifier reads the whole text's window(s) and only the passages that
  address a model (``_readings``);
- in ONNX Runtime with int8 weights first, and only a reading whose int8 log-odds lie within
  ``_INT8_SLACK`` of the threshold's is read again in float32 (``_decide``): int8 moved
  log-odds by ≤ 1.03 on the tuning set and the bench's texts, so its verdicts outside that
  band are float32's.

``score`` reads every reading in float32 ONNX Runtime and matches ``_reference_score`` (every
reading, one unpadded torch forward each, the path before issue 26) to ~3e-7; the tests hold
both, and hold ``check``'s decisions on the tuning set to the reference's. Measured
(bench/guardrails/injection_speed.py, bench/RESULTS.md, a loaded 2-core host): the issue's
mixed 1 KB prompts 0.1 ms p50 (the rule layer decides them); benign 1 KB prompts 35 ms p50
against the reference's 332 ms — the int8 whole-text reading alone is over 15 ms, and a
variant without it lost held-out recall (0.935 to 0.887). Decisions differ from the
reference's only on benign texts, where passages addressing no model (other languages, keys,
code) are not read: 7 of 60 lose a false alarm, none gains one. The graphs are built from the
wheel's weights at the first load and cached (``injection_model.models``).
"""

from __future__ import annotations

import importlib.resources
import io
import math
import pickle  # nosec B403: restricted to one class below
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar

import numpy as np
import regex

from guardrails.base import Finding
from guardrails.detectors import fields, injection_rules

if TYPE_CHECKING:
    import torch

    from guardrails.detectors.injection_model import Logits, Runner

_T = TypeVar("_T")

INJECTION = "injection"
DEFAULT_THRESHOLD = 0.999
_OVERLAP = 64
#: 512-token windows read per text at most (the first and the last, each ~30 ms in int8 on
#: one core; the passages cover what lies between)
_MAX_WINDOWS = 2
#: tokens in a passage read on its own, and passages read per text at most
_PASSAGE = 32
_MAX_PASSAGES = 32
#: int8 moved a reading's log-odds from float32's by 1.03 at most on the tuning set and the
#: speed bench's texts (bench/guardrails/injection_speed.py measures it again): twice that
_INT8_SLACK = 2.0
#: probabilities are clipped this far inside (0, 1) to take log-odds (1 - 1e-7 is float32's
#: last step below 1)
_CLIP = 1e-7
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


class _Reading(NamedTuple):
    """A token sequence the model reads (the beginning-of-sequence token first): a window of
    the whole text, or a passage, which ``addressed`` a model or not (``_readings``)."""

    tokens: list[int]
    window: bool
    addressed: bool

    @property
    def screened(self) -> bool:
        """Read by ``check``: every window, and the passages that address a model."""
        return self.window or self.addressed


class _Loaded(NamedTuple):
    """What ``load`` makes: the package's torch model (the reference, and the source of the
    ONNX graphs) and one ONNX Runtime session per precision."""

    model: torch.nn.Module
    float32: Runner
    int8: Runner


class PromptInjectionDetector:
    """Instructions that try to override the system prompt, role-play jailbreaks (DAN…),
    smuggled or encoded instructions; score = the classifier's probability."""

    name: ClassVar[str] = "prompt_injection"

    def __init__(self) -> None:
        self._loaded: _Loaded | None = None
        self._tokenizer: Any = None
        self._window = 512

    def load(self) -> None:
        """Once per worker process: the tokenizer, the weights, and the ONNX graphs built
        from them (or opened from the cache, ``injection_model.models``)."""
        import torch
        from nanoguard.model import Classifier
        from nanoguard.tokenizer import Tokenizer

        from guardrails.detectors import injection_model

        # One thread: the worker pool is the unit of parallelism, and torch's own threads
        # would fight the other workers for the same cores.
        torch.set_num_threads(1)
        assets = importlib.resources.files("nanoguard.assets")
        encoding = _EncodingOnly(io.BytesIO((assets / "tokenizer.pkl").read_bytes())).load()
        self._tokenizer = Tokenizer(encoding)  # type: ignore[no-untyped-call]
        with importlib.resources.as_file(assets / "model.pt") as path:
            model, _metrics, config = Classifier.from_checkpoint(str(path), device="cpu")
            float32, int8 = injection_model.models(model, path.read_bytes())
        self._window = int(config.sequence_len)
        self._loaded = _Loaded(model, injection_model.Runner(float32), injection_model.Runner(int8))
        self.score("warm up")

    @property
    def _models(self) -> _Loaded:
        if self._loaded is None:
            self.load()
        assert self._loaded is not None
        return self._loaded

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        fields.only(self.name, settings, ("threshold", "classifier"))
        return {
            "threshold": fields.number(settings, "threshold", DEFAULT_THRESHOLD),
            # false: the rules alone, for a use case that trades recall for never asking the
            # classifier
            "classifier": fields.flag(settings, "classifier", True),
        }

    def _readings(self, text: str) -> list[_Reading]:
        """What the model reads: the text itself (in 512-token windows if longer), and, for a
        text of more than a passage, its passages of about a paragraph each. The model
        averages over every token it reads, so one instruction inside a long benign document
        barely moves the whole text's score; read alone, its passage scores as it should.

        ``check`` reads the windows, and a passage only where one of its sentences addresses a
        model (``injection_rules.addresses_the_model``): an injection has to. Not reading the
        windows of a text longer than 128 tokens, too, took the held-out set's recall from
        0.935 to 0.887: a long jailbreak scores as a whole, not by its passages."""
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
        readings = [_Reading([bos, *window], True, False) for window in windows]
        if len(ids) > _PASSAGE:
            passages: list[tuple[list[int], bool]] = [([], False)]
            for sentence in _SENTENCE_END.split(text):
                tokens = encode(sentence)
                if passages[-1][0] and len(passages[-1][0]) + len(tokens) > _PASSAGE:
                    passages.append(([], False))
                held, addressed = passages[-1]
                held.extend(tokens)
                if not addressed and injection_rules.addresses_the_model(sentence):
                    passages[-1] = (held, True)
            pieces = [
                _Reading([bos, *held[i : i + _PASSAGE]], False, addressed)
                for held, addressed in passages
                for i in range(0, len(held), _PASSAGE)
            ]
            readings += _spread(pieces, _MAX_PASSAGES)
        return readings

    def _windows(self, text: str) -> list[list[int]]:
        """Every reading's tokens: what the reference and ``score`` read."""
        return [reading.tokens for reading in self._readings(text)]

    def score(self, text: str) -> float:
        """The highest injection probability over every reading of the text, in float32 ONNX
        Runtime (one pass per batch of similar lengths): the reference's, to float rounding."""
        return _probability(float(_margins(self._models.float32.logits(self._windows(text))).max()))

    def _reference_score(self, text: str) -> float:
        """``score`` the plain way: one unpadded ``Classifier.forward`` per reading in torch
        (padding would leak into the package's attention, see above). The fast paths are
        checked against it."""
        import torch

        model = self._models.model
        with torch.inference_mode():
            logits = torch.cat(
                [
                    model(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.bool))
                    for r in self._windows(text)
                ]
            )
            return float(torch.softmax(logits.float(), -1)[:, 1].max())

    def _screened_score(self, text: str, threshold: float) -> float | None:
        """``_decide`` on the readings ``check`` reads."""
        return self._decide([r.tokens for r in self._readings(text) if r.screened], threshold)

    def _decide(self, readings: list[list[int]], threshold: float) -> float | None:
        """The probability of a reading that reaches ``threshold``, or None if none does.
        int8 reads them all. Its log-odds are within ``_INT8_SLACK`` of float32's, so a
        reading more than that below the threshold's log-odds cannot reach it, and one more
        than that above it does: only the readings in between are read again in float32, the
        highest first, until one reaches the threshold. The decision is float32's. The score
        is the deciding reading's: float32's, or int8's where a reading is that far above the
        threshold (at least 0.9998 at 0.999); a reading not read again could score higher."""
        if not readings:
            return None
        models = self._models
        margins = _margins(models.int8.logits(readings))
        bound = _log_odds(threshold)
        if margins.max() >= bound + _INT8_SLACK:
            return _probability(float(margins.max()))
        # nearest the threshold first: the first to reach it in float32 decides the text
        doubtful = sorted(
            (m, i) for i, m in enumerate(margins.tolist()) if m >= bound - _INT8_SLACK
        )
        for _margin, i in reversed(doubtful):
            probability = _probability(float(_margins(models.float32.logits([readings[i]]))[0]))
            if probability >= threshold:
                return probability
        return None

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        """The rules first (guardrails/detectors/injection_rules.py: an attack's shape is a
        finding at 1.0, whatever the threshold); then the classifier, only where its reading
        means something: a text that addresses a model or its instructions, and is not an
        office "ignore my previous e-mail". Off-topic texts (config lines, greetings in other
        languages, emoji) are where it raises false alarms, and skipping them saves its cost.
        Of a longer text it reads only what addresses a model (``_readings``), in int8 first
        (``_screened_score``)."""
        shape, worth_reading = injection_rules.screen(text)
        if shape is not None:
            return [Finding(INJECTION, 1.0)]
        if not worth_reading or not settings.get("classifier", True):
            return []
        score = self._screened_score(text, float(settings.get("threshold", DEFAULT_THRESHOLD)))
        if score is None:
            return []
        return [Finding(INJECTION, round(score, 4))]


def _margins(logits: Logits) -> Logits:
    """The injection class's log-odds per reading: softmax's probability is its sigmoid."""
    return logits[:, 1] - logits[:, 0]


def _probability(margin: float) -> float:
    """softmax's probability from the log-odds, rounded in float32 as the reference's is (so
    that it reaches 1.0 where the reference's does)."""
    one = np.float32(1.0)
    return float(one / (one + np.exp(np.float32(-margin))))


def _log_odds(probability: float) -> float:
    p = min(max(probability, _CLIP), 1.0 - _CLIP)
    return math.log(p / (1.0 - p))
