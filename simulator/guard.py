"""A deterministic guard model: reads a Llama Guard 3 prompt and answers its verdict.

A real guard model (Llama Guard on vLLM) judges meaning; this one judges words, so tests can
know a verdict before asking. The rule (docs/simulator.md, "The guard model"): each
category's key words are the content words of its name and description
(``lexicon.content_words``: lower-cased, three letters or more, plurals folded, stop words
left out); a category is violated when the last turn of the assessed role contains at least
two distinct key words of it (or all of them, when it has fewer). The answer is ``safe``, or
``unsafe`` and a line of the violated codes (``S2,S3``) in the order the prompt lists them,
as Llama Guard 3 writes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from simulator.lexicon import content_words

CATEGORIES_START = "<BEGIN UNSAFE CONTENT CATEGORIES>"
CATEGORIES_END = "<END UNSAFE CONTENT CATEGORIES>"
CONVERSATION_START = "<BEGIN CONVERSATION>"
CONVERSATION_END = "<END CONVERSATION>"
#: distinct key words of a category the assessed turn must contain to violate it
KEY_WORDS_NEEDED = 2

_CATEGORY_LINE = re.compile(r"^(S\d+):\s*(.*)$")
_TURN_LINE = re.compile(r"^(User|Agent):[ \t]?(.*)$")
_ASSESSED_ROLE = re.compile(r"ONLY THE LAST (User|Agent) message")
# Answer tokens as a Llama 3 tokenizer splits them: words, the newline, punctuation.
_PIECE = re.compile(r"\w+|\s+|[^\w\s]")


@dataclass(frozen=True, slots=True)
class Category:
    code: str  # "S1"
    name: str
    description: str


@dataclass(frozen=True, slots=True)
class GuardPrompt:
    categories: list[Category]
    role: str  # "User" or "Agent": whose last turn is assessed
    turns: list[tuple[str, str]]


def _between(text: str, start: str, end: str) -> str | None:
    at = text.find(start)
    if at < 0:
        return None
    stop = text.find(end, at + len(start))
    return text[at + len(start) : stop if stop >= 0 else len(text)]


def _categories(block: str) -> list[Category]:
    found: list[list[str]] = []  # code, first line, continuation lines…
    for line in block.splitlines():
        match = _CATEGORY_LINE.match(line.strip())
        if match:
            found.append([match.group(1), match.group(2)])
        elif found and line.strip():
            found[-1].append(line.strip())
    categories = []
    for code, first, *more in found:
        name, _, rest = first.partition(". ")
        if not rest:
            name = first.rstrip(".").strip()
        description = " ".join(part for part in (rest.strip(), *more) if part)
        categories.append(Category(code, name.strip(), description))
    return categories


def _turns(block: str) -> list[tuple[str, str]]:
    turns: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        match = _TURN_LINE.match(line)
        if match:
            turns.append((match.group(1), [match.group(2)]))
        elif turns:
            turns[-1][1].append(line)
    return [(role, "\n".join(lines).strip()) for role, lines in turns]


def parse_prompt(prompt: str) -> GuardPrompt | None:
    """The prompt's categories, assessed role and turns; None when it has no categories
    block (not a Llama Guard prompt)."""
    block = _between(prompt, CATEGORIES_START, CATEGORIES_END)
    if block is None:
        return None
    conversation = _between(prompt, CONVERSATION_START, CONVERSATION_END) or ""
    # The instruction follows the conversation: a turn quoting it does not change the role.
    end = prompt.rfind(CONVERSATION_END)
    role = _ASSESSED_ROLE.search(prompt, end if end >= 0 else 0)
    return GuardPrompt(_categories(block), role.group(1) if role else "User", _turns(conversation))


def category_keywords(category: Category) -> frozenset[str]:
    return frozenset(content_words(f"{category.name} {category.description}"))


def violated(prompt: GuardPrompt) -> list[str]:
    """The codes of the categories the last turn of the assessed role violates."""
    assessed = [text for role, text in prompt.turns if role == prompt.role]
    if not assessed:
        return []
    said = frozenset(content_words(assessed[-1]))
    codes = []
    for category in prompt.categories:
        keys = category_keywords(category)
        if keys and len(keys & said) >= min(KEY_WORDS_NEEDED, len(keys)):
            codes.append(category.code)
    return codes


def verdict(prompt: str) -> str:
    """What the guard model answers to ``prompt``: ``safe`` or ``unsafe\\nS1,S3``."""
    parsed = parse_prompt(prompt)
    codes = violated(parsed) if parsed is not None else []
    return "unsafe\n" + ",".join(codes) if codes else "safe"


def answer_tokens(prompt: str) -> tuple[str, ...]:
    """The verdict as the tokens the model emits, one per decode step."""
    return tuple(_PIECE.findall(verdict(prompt)))
