"""Prompt injection and jailbreaks: NanoGuard, a 16.8M-parameter transformer classifier whose
weights ship in the PyPI package ``metatronnanoguard`` (MIT).

Vetted before use (see docs/guardrails-catalogue.md): the package is ~200 lines of plain
PyTorch with no network access; its weights load with ``torch.load(weights_only=True)``. Its
tokenizer, however, is a pickled ``tiktoken.Encoding`` that the package opens with a bare
``pickle.load`` — arbitrary code if the wheel were tampered with. So this module does not call
``NanoGuard()``: it unpickles the tokenizer with an unpickler that admits only that one class,
and loads the weights itself through the package's own ``Classifier.from_checkpoint``.

Inference differs from the package's ``scan`` in one way: the package pads every text to 512
tokens, and its attention does not mask padding, so pad tokens leak into every score and each
call costs ~0.5 s on one core. Scoring the tokens alone is ~40 ms and is what the evaluation
set measures. Texts longer than the model's 512-token window are scored in overlapping windows
(the payload of a long injection is often at the end); the text's score is the highest.
"""

from __future__ import annotations

import importlib.resources
import io
import pickle  # nosec B403: restricted to one class below
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from guardrails.base import Finding
from guardrails.detectors import fields

if TYPE_CHECKING:
    import torch

INJECTION = "injection"
DEFAULT_THRESHOLD = 0.9
_OVERLAP = 64
#: windows scored per text at most (a 60k-token paste is not worth 100 forward passes)
_MAX_WINDOWS = 16


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
        fields.only(self.name, settings, ("threshold",))
        return {"threshold": fields.number(settings, "threshold", DEFAULT_THRESHOLD)}

    def _windows(self, text: str) -> list[list[int]]:
        bos = self._tokenizer.bos_token_id
        ids: list[int] = self._tokenizer.enc.encode_ordinary(text)
        size = self._window - 1
        if len(ids) <= size:
            return [[bos, *ids]]
        step = size - _OVERLAP
        starts = list(range(0, len(ids) - size + step, step))
        if len(starts) > _MAX_WINDOWS:
            # Keep the beginning and the end, and spread the rest evenly between them.
            last = starts[-1]
            starts = [round(i * last / (_MAX_WINDOWS - 1)) for i in range(_MAX_WINDOWS)]
        return [[bos, *ids[start : start + size]] for start in starts]

    def score(self, text: str) -> float:
        if self._model is None:
            self.load()
        assert self._model is not None
        import torch

        with torch.inference_mode():
            # Each window alone, unpadded: padding would leak into the attention (see above).
            logits = torch.cat(
                [
                    self._model(
                        torch.tensor([window]), torch.ones(1, len(window), dtype=torch.bool)
                    )
                    for window in self._windows(text)
                ]
            )
            probabilities = torch.softmax(logits.float(), dim=-1)[:, 1]
        return float(probabilities.max())

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        score = self.score(text)
        if score < float(settings.get("threshold", DEFAULT_THRESHOLD)):
            return []
        return [Finding(INJECTION, round(score, 4))]
