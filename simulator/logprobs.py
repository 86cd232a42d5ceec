"""Token log probabilities in vLLM's shapes, from a rule tests can predict.

Asked for (chat ``logprobs: true`` with ``top_logprobs: k``; completions ``logprobs: k``),
every generated token gets a log probability that says whether the "model" read its word in
the prompt: a token whose word (lower-cased letters and digits) occurs in the prompt's text is
**confident**, a logprob in [-0.11, -0.01]; any other token is **unsure**, a logprob in
[-5.0, -2.5]. A test gets a known low-confidence span by leaving words out of the prompt, and a
clean answer by putting the vocabulary in (``simulator.tokens.VOCABULARY``). The values are
drawn from the choice's key and the token's index, so the same request gets the same numbers.
End-of-sequence (no text) is confident.

Alternatives (``top_logprobs``) follow vLLM's order: the sampled token first, then other
vocabulary words by rank. A confident token is the top-ranked one, so ``k`` entries hold it
and k − 1 alternatives, all less likely; an unsure token is outranked by every alternative,
so the list holds it and the k (completions: k + 1 entries, vLLM's "top k plus the sampled
one") or k − 1 (chat: vLLM cuts at k) most likely words, each more likely than it.
Prompt logprobs (``echo`` with ``logprobs``) are not simulated: only generated tokens count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from simulator import tokens, wire

_WORD = re.compile(r"[a-z0-9]+")
_SALT = 0x10_6B_B0_B5


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float
    #: the sampled token first, then alternatives by rank (vLLM's dict order)
    ranked: tuple[tuple[str, float], ...]


def prompt_words(text: str) -> frozenset[str]:
    """The words a prompt holds: what its answer's tokens are confident about."""
    return frozenset(_WORD.findall(text.lower()))


def token_logprob(
    token: str, key: int, index: int, words: frozenset[str], top: int
) -> TokenLogprob:
    """Token ``index`` of the answer seeded by ``key``, ranked against the ``top`` most
    likely words (the numbers are plausible, not a distribution that sums to 1)."""
    h = tokens.splitmix64(key ^ _SALT ^ (index * 0x9E3779B1))
    found = _WORD.findall(token.lower())
    confident = not found or all(word in words for word in found)
    logprob = -round(0.01 + (h % 101) / 1000 if confident else 2.5 + (h % 251) / 100, 4)
    # vLLM's dict: the sampled token, then the top k; a confident token is one of those k.
    wanted = 1 + (top - 1 if confident else top)
    ranked = [(token, logprob)]
    taken = {token.strip()}
    j = 0
    while len(ranked) < wanted:
        j += 1
        word = tokens.VOCABULARY[tokens.splitmix64(h + j) % len(tokens.VOCABULARY)]
        if word in taken:
            continue
        taken.add(word)
        rank = len(ranked)
        if confident:  # each alternative less likely than the token
            value = logprob - 2.0 * rank
        else:  # each more likely than the token, the best first
            value = logprob + (-0.3 - logprob) * (top + 1 - rank) / top
        ranked.append((" " + word if token.startswith(" ") else word, round(value, 4)))
    return TokenLogprob(token, logprob, tuple(ranked))


def chat_content(entries: list[TokenLogprob], top: int) -> wire.Json:
    """``choice.logprobs`` of a chat answer (``ChatCompletionLogProbs``): the first ``top``
    of each token's ranked list as ``top_logprobs``, none when ``top`` is 0."""
    return {
        "content": [
            {
                "token": e.token,
                "logprob": e.logprob,
                "bytes": list(e.token.encode()),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode())}
                    for t, lp in e.ranked[:top]
                ],
            }
            for e in entries
        ]
    }


def completion_logprobs(entries: list[TokenLogprob], top: int, offset: int) -> wire.Json:
    """``choice.logprobs`` of a completion (``CompletionLogProbs``): ``top`` + 1 entries of
    each ranked list (vLLM keeps ranks 0..k), text offsets counted from ``offset``."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return {
        "text_offset": offsets,
        "token_logprobs": [e.logprob for e in entries],
        "tokens": [e.token for e in entries],
        "top_logprobs": [dict(e.ranked[: top + 1]) for e in entries],
    }
