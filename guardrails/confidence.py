"""Low-confidence spans: runs of tokens the model generated with a low log probability.

The second reading of groundedness (guardrails/grounding.py, ``method`` "logprobs" or
"both"): where a model is unsure of what it says, it is more likely to be making it up. A
**span** is at least ``min_span_tokens`` consecutive tokens each below ``min_logprob``; one
such span is one ``low_confidence`` finding, scored 1 − the span's mean token probability.
Low confidence is a hint, not proof: a paraphrase or a rare name is unsure too, and a model can
be sure and wrong (docs/guardrails-fleet.md).

The tokens come from the answer itself, in vLLM's shapes (chat ``choice.logprobs.content``,
completions ``choice.logprobs.tokens``/``token_logprobs``), which the gateway asks the model
for when a use case needs them (gateway/guardrails/fleet.py ``ask_logprobs``). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from guardrails.base import Finding

#: one generated token: its text and log probability
Token = tuple[str, float]
ENTITY = "low_confidence"
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Span:
    """Tokens [start, end) of a choice's answer, all unsure; ``text`` is theirs joined."""

    start: int
    end: int
    text: str
    score: float

    def finding(self) -> Finding:
        # The record keeps the kind and the score, never the text (guardrails/base.py).
        return Finding(ENTITY, score=self.score)


def client_asked(path: str, document: object) -> bool:
    """Whether the request asks for logprobs itself (then its answer keeps them)."""
    if not isinstance(document, Mapping):
        return False
    value = document.get("logprobs")
    if path == CHAT_PATH:
        return value is True
    return value is not None and value is not False


def choice_tokens(logprobs: object) -> list[Token] | None:
    """A choice's (or a stream chunk's) tokens, from either vLLM shape; None if it carries
    none or they are not numbers."""
    if not isinstance(logprobs, Mapping):
        return None
    if "content" in logprobs:  # chat: ChatCompletionLogProbs
        content = logprobs["content"]
        if not isinstance(content, list):
            return None
        out: list[Token] = []
        for entry in content:
            if not isinstance(entry, Mapping):
                return None
            token, value = entry.get("token"), entry.get("logprob")
            if not isinstance(token, str) or not _number(value):
                return None
            out.append((token, float(value)))
        return out
    tokens, values = logprobs.get("tokens"), logprobs.get("token_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list) or len(tokens) != len(values):
        return None
    out = []
    for token, value in zip(tokens, values, strict=True):
        if not isinstance(token, str):
            return None
        # vLLM gives null for a prompt token with no logprob (echo): not generated, skipped.
        if value is None:
            continue
        if not _number(value):
            return None
        out.append((token, float(value)))
    return out


def answer_tokens(answer: object) -> dict[int, list[Token]] | None:
    """Each choice's tokens by choice index; None when a choice carries no logprobs."""
    choices = answer.get("choices") if isinstance(answer, Mapping) else None
    if not isinstance(choices, list):
        return None
    found: dict[int, list[Token]] = {}
    for position, choice in enumerate(choices):
        if not isinstance(choice, Mapping):
            return None
        tokens = choice_tokens(choice.get("logprobs"))
        if tokens is None:
            return None
        index = choice.get("index", position)
        found[index if isinstance(index, int) else position] = tokens
    return found


def strip(answer: dict[str, Any]) -> None:
    """The answer as the client would have had it without logprobs: each choice's null."""
    for choice in answer.get("choices") or ():
        if isinstance(choice, dict) and "logprobs" in choice:
            choice["logprobs"] = None


def spans(tokens: Sequence[Token], min_logprob: float, min_tokens: int) -> list[Span]:
    """Every run of at least ``min_tokens`` consecutive tokens below ``min_logprob``.
    Tokens without text (end of sequence) neither count in a run nor break one."""
    found: list[Span] = []
    run: list[Token] = []
    start = 0
    for i, (token, value) in enumerate(tokens):
        if not token:
            continue
        if value < min_logprob:
            if not run:
                start = i
            run.append((token, value))
            continue
        _close(found, run, start, i, min_tokens)
        run = []
    _close(found, run, start, len(tokens), min_tokens)
    return found


def _close(found: list[Span], run: list[Token], start: int, end: int, min_tokens: int) -> None:
    if run and len(run) >= min_tokens:
        mean = sum(v for _, v in run) / len(run)
        text = "".join(t for t, _ in run).strip()
        found.append(Span(start, end, text, round(1.0 - math.exp(mean), 4)))


def open_run(tokens: Sequence[Token], min_logprob: float) -> int:
    """Where the run of unsure tokens the sequence ends on begins (``len`` if it ends sure):
    a stream keeps those tokens for its next window, so a span is judged whole."""
    at = len(tokens)
    while at > 0 and (tokens[at - 1][1] < min_logprob or not tokens[at - 1][0]):
        at -= 1
    return at


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
