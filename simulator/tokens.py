"""Cheap, deterministic stand-ins for a tokenizer and for sampling.

Token counts approximate a BPE tokenizer on English (about four characters per token, plus
a few tokens of chat template per message). Generated text is a sequence of words drawn
from a fixed vocabulary by a counter-based hash of a per-request key, so the same request
always gets the same answer and producing token *i* never needs tokens 0..i-1.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

CHARS_PER_TOKEN = 4
# Llama-3-style template: header tokens around each message, and the assistant header
# that the generation prompt appends.
TOKENS_PER_MESSAGE = 4
GENERATION_PROMPT_TOKENS = 3
# Answers end on their own ("stop") after this many tokens unless max_tokens comes first.
MIN_NATURAL_TOKENS = 16
NATURAL_TOKENS_SPREAD = 240

_MASK64 = (1 << 64) - 1

_WORDS = """the of and to in is that for it as with was on be by this are from at or an
    which have not has but were can more one all their also its been other when there
    into some these than time only may new about first two most after over such used
    system model data request server queue token batch cache memory latency throughput
    replica gateway policy tenant priority stream prefix budget window capacity fleet
    engine schedule decode prefill sequence kernel tensor weight layer attention vector
    result value number order state process network signal answer question reason simple
    clear quick steady careful small large early late short long high low fast slow
    good better best open close start finish keep move send read write check measure
    build serve route share limit grow split merge plan test learn show help make take
    give find know think look want need seem feel leave call work try ask turn follow
    begin carry hold bring happen write provide sit stand lose pay meet include continue
    set change lead understand watch stop create speak allow add spend offer remember
    love consider appear buy wait die reach kill remain suggest raise pass sell require
    report decide pull river mountain city ocean forest garden bridge road market
    morning evening winter summer light music story paper letter voice friend family
    """
VOCABULARY: tuple[str, ...] = tuple(_WORDS.split())


def splitmix64(x: int) -> int:
    """A fast, well-mixed 64-bit hash of an integer (SplitMix64's finaliser)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def stable_key(*parts: object) -> int:
    """A 64-bit key that is the same in every process (``hash()`` is salted per process)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def count_text_tokens(text: str) -> int:
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def count_chat_tokens(contents: Sequence[str]) -> int:
    return (
        sum(count_text_tokens(c) for c in contents)
        + TOKENS_PER_MESSAGE * len(contents)
        + GENERATION_PROMPT_TOKENS
    )


def natural_length(key: int) -> int:
    """How many tokens the "model" wants to say before its end-of-sequence token."""
    return MIN_NATURAL_TOKENS + splitmix64(key ^ 0x5EED) % NATURAL_TOKENS_SPREAD


def token_text(key: int, index: int) -> str:
    word = VOCABULARY[splitmix64(key + index) % len(VOCABULARY)]
    return word if index == 0 else " " + word


def output_text(key: int, start: int, stop: int) -> str:
    return "".join(token_text(key, i) for i in range(start, stop))


def find_stop(
    text_of: Callable[[int], str], limit: int, stops: Sequence[str]
) -> tuple[int, str, int] | None:
    """Where the first stop string completes within the first ``limit`` tokens.

    Returns (tokens generated when it completes, the stop string, the character offset at
    which it begins in the output), or None.
    """
    text = ""
    for i in range(limit):
        text += text_of(i)
        # Only the tail can contain a match that the previous tokens did not.
        window_start = max(0, len(text) - max(len(s) for s in stops) - 16)
        best: tuple[int, str] | None = None
        for s in stops:
            at = text.find(s, window_start)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, s)
        if best is not None:
            return i + 1, best[1], best[0]
    return None


def text_blocks(text: str, block_tokens: int) -> list[int]:
    """Chained hashes of the text's full KV blocks, as vLLM's prefix cache keys them.

    Block *i*'s hash covers everything up to the end of block *i*, so two prompts share
    exactly the leading blocks in which they agree.
    """
    size = block_tokens * CHARS_PER_TOKEN
    hashes: list[int] = []
    h = 0
    for start in range(0, len(text) - size + 1, size):
        h = hash((h, text[start : start + size]))
        hashes.append(h)
    return hashes


def token_id_blocks(ids: Sequence[int], block_tokens: int) -> list[int]:
    hashes: list[int] = []
    h = 0
    for start in range(0, len(ids) - block_tokens + 1, block_tokens):
        h = hash((h, tuple(ids[start : start + block_tokens])))
        hashes.append(h)
    return hashes


def render_chat(messages: Iterable[tuple[str, str]]) -> str:
    """The prompt text that the prefix cache sees: role headers and contents, in order."""
    return "".join(f"<|{role}|>{content}\n" for role, content in messages)
