"""Toxicity and profanity: ``alt-profanity-check``'s linear model (shipped in its wheel).

The model is a bag-of-words classifier trained on short comments, so one insult inside a long,
polite answer barely moves a whole-text score. The text is scored sentence by sentence (lines
and sentence ends) and the worst sentence is the text's score.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import regex

from guardrails.base import Finding
from guardrails.detectors import fields

TOXICITY = "toxicity"
DEFAULT_THRESHOLD = 0.8
_SENTENCES = regex.compile(r"(?<=[.!?;])\s+|\n+")
#: sentences scored per text at most; a long answer is cut into this many groups
_MAX_PIECES = 256


class ToxicityDetector:
    """Insults, profanity, abuse; score = the model's probability for the worst sentence."""

    name: ClassVar[str] = "toxicity"

    def __init__(self) -> None:
        self._predict: Callable[[Sequence[str]], Any] | None = None

    def load(self) -> None:
        with warnings.catch_warnings():
            # The wheel's model was pickled by an older scikit-learn; it loads and predicts
            # the same (tests/guardrails/test_toxicity.py holds its answers).
            warnings.simplefilter("ignore")
            from profanity_check import predict_prob  # type: ignore[import-untyped]

            predict_prob(["warm up"])
        self._predict = predict_prob

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        fields.only(self.name, settings, ("threshold",))
        return {"threshold": fields.number(settings, "threshold", DEFAULT_THRESHOLD)}

    def score(self, text: str) -> float:
        if self._predict is None:
            self.load()
        assert self._predict is not None
        pieces = [p for p in _SENTENCES.split(text) if p.strip()] or [text]
        if len(pieces) > _MAX_PIECES:
            size = -(-len(pieces) // _MAX_PIECES)
            pieces = [" ".join(pieces[i : i + size]) for i in range(0, len(pieces), size)]
        return float(max(self._predict(pieces)))

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        score = self.score(text)
        if score < float(settings.get("threshold", DEFAULT_THRESHOLD)):
            return []
        return [Finding(TOXICITY, round(score, 4))]
