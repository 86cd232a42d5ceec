"""Words as the simulator's models see them: what the guard model matches and the embedding
model counts. Deliberately crude (no stemming beyond plurals, no synonyms): tests must be
able to predict a verdict or a similarity by reading the texts.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[a-z0-9]+")

# Words that describe any category ("content that…", "AI models should not…") or any
# sentence ("the", "which") and so say nothing about what a text is about.
_STOP_TEXT = """
    the and for are but not you your yours our ours their theirs they them this that these
    those with without from into onto about above below over under than then there here
    when where which while who whom whose what why how all any each every both either neither
    some such other others own same very can could should would may might must will shall
    has have had having was were been being does did doing done its also only just
    more most less least many much few one two via per etc including include includes
    included like content contents message messages model models text texts response
    responses user users agent agents assistant ask asks asking asked give gives giving
    provide provides providing request requests specific general generally related regarding
    something anything everything someone anyone everyone thing things way ways use uses used
    using make makes making get gets getting tell tells telling help helps helping
    """
STOP_WORDS = frozenset(_STOP_TEXT.split())


def fold(word: str) -> str:
    """A plural's trailing ``s`` dropped (``stocks`` → ``stock``, not ``illness``)."""
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


_STOP = STOP_WORDS | {fold(w) for w in STOP_WORDS}


def content_words(text: str) -> list[str]:
    """The text's words in order: lower-cased, three letters or more (``_`` splits words),
    plurals folded, stop words left out."""
    found = (fold(w) for w in _WORD.findall(text.lower()) if len(w) >= 3)
    return [w for w in found if w not in _STOP]
