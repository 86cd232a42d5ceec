"""Invisible and smuggling characters: text a person does not see but a model reads.

Attacks hide instructions in Unicode tag characters (U+E0000 block, "ASCII smuggling"), in
variation selectors, or split a keyword with zero-width characters so a filter misses it;
bidirectional overrides make displayed text differ from what is sent ("Trojan Source").
Each run of same-kind characters is one finding with its span, so redaction replaces a hidden
payload by one marker. The joiners (ZWJ, ZWNJ) are legitimate inside emoji sequences and in
scripts such as Persian or Devanagari, so they count only next to ASCII or at an edge.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any, ClassVar

import regex

from guardrails.base import Finding, SettingsError
from guardrails.detectors import fields

ZERO_WIDTH = "ZERO_WIDTH"
BIDI_CONTROL = "BIDI_CONTROL"
TAG_CHARACTER = "TAG_CHARACTER"
VARIATION_SELECTOR = "VARIATION_SELECTOR"
PRIVATE_USE = "PRIVATE_USE"
FORMAT_CHARACTER = "FORMAT_CHARACTER"

#: the entity vocabulary, in the order a category wins when a character fits two
CATEGORIES = (
    TAG_CHARACTER,
    BIDI_CONTROL,
    ZERO_WIDTH,
    VARIATION_SELECTOR,
    PRIVATE_USE,
    FORMAT_CHARACTER,
)

_ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff\u180e")
_JOINERS = frozenset("\u200c\u200d")
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
# Anything that could be one of ours; the common case (none in the text) costs one search.
_CANDIDATES = regex.compile(r"[\p{Cf}\p{Co}\u180e\U000E0100-\U000E01EF]")
_CODE_POINT = regex.compile(r"^U\+([0-9A-F]{4,6})$", regex.IGNORECASE)


def category(char: str) -> str | None:
    """Which kind of invisible character ``char`` is, or None for a visible one."""
    code = ord(char)
    if 0xE0000 <= code <= 0xE007F:
        return TAG_CHARACTER
    if char in _BIDI:
        return BIDI_CONTROL
    if char in _ZERO_WIDTH:
        return ZERO_WIDTH
    if 0xE0100 <= code <= 0xE01EF:
        return VARIATION_SELECTOR
    kind = unicodedata.category(char)
    if kind == "Co":
        return PRIVATE_USE
    if kind == "Cf":
        return FORMAT_CHARACTER
    return None


def _joiner_is_legitimate(text: str, at: int) -> bool:
    """A joiner between two non-ASCII, non-space characters (an emoji sequence, an Indic or
    Arabic-script word) is how those are written."""
    before = text[at - 1] if at > 0 else ""
    after = text[at + 1] if at + 1 < len(text) else ""
    return all(c and not c.isascii() and not c.isspace() for c in (before, after))


class InvisibleTextDetector:
    """Zero-width, bidirectional-override, tag, variation-selector, private-use and other
    format characters."""

    name: ClassVar[str] = "invisible_text"

    def load(self) -> None:
        """Nothing to load: the Unicode database ships with Python."""

    def validate(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        fields.only(self.name, settings, ("categories", "allow"))
        categories = fields.choices(settings, "categories", CATEGORIES, CATEGORIES)
        allow = fields.strings(settings, "allow", (), max_items=100, max_length=8)
        normalised = []
        for item in allow:
            match = _CODE_POINT.match(item.strip())
            if match is None or int(match.group(1), 16) > 0x10FFFF:
                raise SettingsError(f"'allow': '{item}' is not a code point written like U+200D.")
            normalised.append(f"U+{int(match.group(1), 16):04X}")
        return {"categories": categories, "allow": normalised}

    def check(self, text: str, settings: Mapping[str, Any]) -> list[Finding]:
        if _CANDIDATES.search(text) is None:
            return []
        wanted = frozenset(settings.get("categories", CATEGORIES))
        allowed = frozenset(int(code[2:], 16) for code in settings.get("allow", ()))
        findings: list[Finding] = []
        for at, char in enumerate(text):
            kind = category(char)
            if kind is None or kind not in wanted or ord(char) in allowed:
                continue
            if char in _JOINERS and _joiner_is_legitimate(text, at):
                continue
            last = findings[-1] if findings else None
            if last is not None and last.entity == kind and last.end == at:
                findings[-1] = Finding(kind, 1.0, last.start, at + 1)
            else:
                findings.append(Finding(kind, 1.0, at, at + 1))
        return findings
