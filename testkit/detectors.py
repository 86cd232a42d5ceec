"""A company's own detectors, added to the catalogue by dotted path as a deployment would
(``SWITCHYARD_GUARDRAIL_DETECTORS``): governance validates selections of them with their own
``validate``, exactly as it does the built-in ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from guardrails.base import Finding, SettingsError


class WordListDetector:
    """Words the company never wants to see."""

    name: ClassVar[str] = "wordlist"
    label: ClassVar[str] = "Company word list"
    stages: ClassVar[tuple[str, ...]] = ("request", "response")
    redacts: ClassVar[bool] = True

    def load(self) -> None:
        return None

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(settings) - {"words", "case_sensitive"})
        if unknown:
            raise SettingsError(f"{unknown[0]}: not a setting of this guardrail.")
        words = settings.get("words")
        if not isinstance(words, list) or not words:
            raise SettingsError("words: give a non-empty list of words.")
        if not all(isinstance(word, str) and word.strip() for word in words):
            raise SettingsError("words: every word is a non-empty string.")
        case_sensitive = settings.get("case_sensitive", False)
        if not isinstance(case_sensitive, bool):
            raise SettingsError("case_sensitive: true or false.")
        return {"words": list(words), "case_sensitive": case_sensitive}

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        haystack = text if settings["case_sensitive"] else text.lower()
        found = []
        for word in settings["words"]:
            needle = word if settings["case_sensitive"] else word.lower()
            at = haystack.find(needle)
            while at >= 0:
                found.append(Finding("word", 1.0, at, at + len(needle)))
                at = haystack.find(needle, at + 1)
        return found


class PromptLengthDetector:
    """Prompts longer than the company allows."""

    name: ClassVar[str] = "prompt_length"
    stages: ClassVar[tuple[str, ...]] = ("request",)
    redacts: ClassVar[bool] = False

    def load(self) -> None:
        return None

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        limit = settings.get("max_chars", 4000)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise SettingsError("max_chars: a whole number of characters, at least 1.")
        return {"max_chars": limit}

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        return [Finding("too_long")] if len(text) > settings["max_chars"] else []


class ShoutingDetector:
    """Text written in capitals."""

    name: ClassVar[str] = "shouting"
    stages: ClassVar[tuple[str, ...]] = ("request", "response")
    redacts: ClassVar[bool] = False

    def load(self) -> None:
        return None

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        if settings:
            raise SettingsError(f"{sorted(settings)[0]}: this guardrail has no settings.")
        return {}

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        letters = [c for c in text if c.isalpha()]
        return [Finding("shouting")] if letters and all(c.isupper() for c in letters) else []


COMPANY_DETECTORS = (
    "wordlist=testkit.detectors:WordListDetector,"
    "prompt_length=testkit.detectors:PromptLengthDetector,"
    "shouting=testkit.detectors:ShoutingDetector"
)
