"""Detectors for tests, loaded through the catalogue's dotted-path extension
(``SWITCHYARD_GUARDRAIL_DETECTORS``) exactly as a company's own would be.

Deterministic on purpose: the tests assert what the gateway does with findings, not how well
a model finds things (the real detectors have their own tests and evaluation set).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from guardrails.base import Finding, SettingsError

# What the tests put in SWITCHYARD_GUARDRAIL_DETECTORS.
SPEC = ",".join(
    (
        "words=testkit.guardrail_detectors:WordDetector",
        "slow=testkit.guardrail_detectors:SlowDetector",
        "broken=testkit.guardrail_detectors:BrokenDetector",
    )
)
# The guardrail service the tests start: these detectors, one worker, "words" loaded at start.
SERVICE_ENV = {
    "SWITCHYARD_GUARDRAIL_WORKERS": "1",
    "SWITCHYARD_GUARDRAIL_DETECTORS": SPEC,
    "SWITCHYARD_GUARDRAIL_PRELOAD": "words",
}


class WordDetector:
    """Finds listed words (whole words, any case) and points at each one."""

    name: ClassVar[str] = "words"
    redacts: ClassVar[bool] = True

    def load(self) -> None:
        return None

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        words = settings.get("words")
        if not isinstance(words, list) or not all(isinstance(w, str) and w for w in words):
            raise SettingsError("'words' must be a list of non-empty strings.")
        return {"words": words, "entity": str(settings.get("entity", "WORD"))}

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        entity = str(settings.get("entity", "WORD"))
        pattern = r"\b(" + "|".join(re.escape(w) for w in settings["words"]) + r")\b"
        return [
            Finding(entity, 0.9, match.start(), match.end())
            for match in re.finditer(pattern, text, re.IGNORECASE)
        ]


class SlowDetector:
    """Sleeps ``seconds`` on every text: a detector stuck past the check timeout."""

    name: ClassVar[str] = "slow"

    def load(self) -> None:
        return None

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        return {"seconds": float(settings.get("seconds", 30.0))}

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        time.sleep(float(settings.get("seconds", 30.0)))
        return []


class BrokenDetector:
    """Raises on every text: a detector with a bug."""

    name: ClassVar[str] = "broken"

    def load(self) -> None:
        return None

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        return dict(settings)

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        raise RuntimeError(f"broken detector saw {text!r}")
