"""The one interface every detector implements, and what a check reports.

A detector is a small class: ``check(text, settings) -> findings``. It never sees the
selection's action (block, redact, flag): the engine decides what a finding means. A detector
whose findings carry spans can be used to redact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol


class SettingsError(ValueError):
    """A selection's settings a detector cannot use; the message names the field."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a detector found in one text.

    ``entity``: what it is, from a bounded vocabulary the detector documents (``EMAIL_ADDRESS``,
    ``PRIVATE_KEY``, ``injection``, ``profanity``, ``language:fr``…): it is recorded and
    exported as a metric label, so never the matched text itself. ``start``/``end``: the span
    in the text (characters), when the detector can point at one; redaction needs it.
    """

    entity: str
    score: float = 1.0
    start: int | None = None
    end: int | None = None


class Detector(Protocol):
    """What the engine calls. One instance per worker process, made once (``load`` may take
    seconds: a spaCy pipeline, a classifier's weights), then ``check`` many times."""

    #: the catalogue name a selection uses ("pii", "secrets", …)
    name: ClassVar[str]

    def load(self) -> None:
        """Load models now (at worker start), not on the first request."""

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The settings made complete (defaults filled in) or ``SettingsError``. Pure and
        cheap: governance calls it (through the catalogue) when a selection is saved."""

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        """What this detector finds in ``text`` under ``settings`` (already validated)."""


class BatchDetector(Detector, Protocol):
    """A detector that can also read many texts in one call, cheaper than one by one (a model
    scoring a batch in one forward pass). Optional: the engine uses ``check_many`` when a
    detector has it (guardrails/engine.py ``Engine.run_many``, for the guardrail service's
    batches) and calls ``check`` text by text otherwise."""

    def check_many(self, texts: list[str], settings: Mapping[str, Any]) -> list[list[Finding]]:
        """``check(text, settings)`` for each text, in order: exactly what it would find."""
