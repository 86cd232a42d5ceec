"""The company detector docs/guardrails-catalogue.md shows, kept here so a test proves the
example works as written (loaded by dotted path through SWITCHYARD_GUARDRAIL_DETECTORS)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import regex

from guardrails.base import Finding, SettingsError


class AccountNumberDetector:
    """Acme's internal account numbers (ACME-########)."""

    name: ClassVar[str] = "bank_account_no"
    label: ClassVar[str] = "Acme account numbers"  # optional: shown in the portal
    stages: ClassVar[tuple[str, ...]] = ("request", "response")  # optional, default both
    redacts: ClassVar[bool] = True  # optional: findings carry spans

    def load(self) -> None:
        self._pattern = regex.compile(r"\bACME-\d{8}\b")  # load models here, once per worker

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        if set(settings) - {"score"}:
            raise SettingsError("bank_account_no: the only setting is 'score'.")
        return {"score": float(settings.get("score", 0.9))}

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        return [
            Finding("ACME_ACCOUNT", settings["score"], m.start(), m.end())
            for m in self._pattern.finditer(text)
        ]
