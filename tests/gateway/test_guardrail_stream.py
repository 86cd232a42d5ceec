"""The stream windowing (gateway/guardrails/stream.py) is hand-written SSE framing: hypothesis
generates chat streams as vLLM writes them, cuts them at random byte boundaries, and runs
them through ``GuardedStream`` against the real guardrail service (the ``words`` detector,
redacting). Whatever the cuts and the window, the client must read exactly the text the
replica sent with every listed word redacted, the finish event, and ``[DONE]`` last; the
usage chunk only when the client asked for it."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.guardrail_plan import StageChecks
from gateway.guardrails.stream import GuardedStream
from guardrails.protocol import CheckSpec
from testkit.guardrail_service import GuardrailServiceFactory
from testkit.guardrails import service_guardrails

CHECKS = StageChecks("response", (CheckSpec("words", "redact", {"words": ["secret"]}),), ())
WORDS = st.sampled_from(["secret", "Secret", "secrets", "plan", "a", "the", "ünïcode", "42"])
PIECES = st.lists(
    st.lists(WORDS, min_size=1, max_size=4)
    .map(" ".join)
    .flatmap(lambda text: st.sampled_from([text, text + " ", " " + text])),
    min_size=1,
    max_size=40,
)


@pytest.fixture
def guardrail_service(start_guardrail_service: GuardrailServiceFactory):
    return start_guardrail_service()


def _event(document: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(document) + b"\n\n"


def _stream(pieces: list[str]) -> bytes:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [
        _event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    ]
    events += [
        _event(
            {**head, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        )
        for piece in pieces
    ]
    events.append(_event({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    events.append(_event({**head, "choices": [], "usage": {"prompt_tokens": 1}}))
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


def _read(out: bytes) -> tuple[str, list[Any]]:
    text, finishes = [], []
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    parsed = [orjson.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    for event in parsed:
        for choice in event["choices"]:
            text.append(choice["delta"].get("content") or "")
            if choice.get("finish_reason"):
                finishes.append(choice["finish_reason"])
    return "".join(text), [finishes, [e for e in parsed if not e["choices"]]]


def _guarded(guardrails: Any, checks: StageChecks, window: int, strip: bool) -> GuardedStream:
    """A chat stream under ``checks``, failing closed, as the gateway makes one."""
    return GuardedStream(
        path="/v1/chat/completions",
        checks=checks,
        guardrails=guardrails,
        window_chars=window,
        failure="closed",
        strip_usage=strip,
        document={},
    )


async def _relay(url: str, raw: bytes, cuts: list[int], window: int, strip: bool) -> bytes:
    async with service_guardrails(url) as guardrails:
        stream = _guarded(guardrails, CHECKS, window, strip)
        out = []
        at = 0
        for cut in [*sorted(cuts), len(raw)]:
            if cut > at:
                out.append(await stream.feed(raw[at:cut]))
                at = cut
        out.append(await stream.finish())
    assert not stream.ended
    return b"".join(out)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pieces=PIECES,
    cuts=st.lists(st.integers(min_value=1, max_value=4000), max_size=12),
    window=st.integers(min_value=1, max_value=64),
    strip=st.booleans(),
)
def test_any_cut_of_a_stream_reads_as_the_whole_text_redacted(
    guardrail_service, pieces: list[str], cuts: list[int], window: int, strip: bool
):
    raw = _stream(pieces)
    out = asyncio.run(_relay(guardrail_service.url, raw, cuts, window, strip))
    text, (finishes, usage) = _read(out)
    assert text == re.sub(r"\bsecret\b", "<WORD>", "".join(pieces), flags=re.IGNORECASE)
    assert finishes == ["stop"]
    assert len(usage) == (0 if strip else 1)


# --- an entity across the cut (the real detectors) -----------------------------------------
# The plan's window for PII and banned substrings (gateway/guardrail_plan.py WINDOW_CHARS).
WINDOW = 128
FILLER = (
    "the weather stayed mild all week and the river ran slowly past the mill while we "
    "walked along the path talking about nothing much at all "
)


@pytest.fixture
def real_service(start_guardrail_service: GuardrailServiceFactory):
    return start_guardrail_service(
        SWITCHYARD_GUARDRAIL_PRELOAD="pii,banned_substrings",
        SWITCHYARD_GUARDRAIL_CHECK_TIMEOUT_SECONDS="30",
        SWITCHYARD_GUARDRAIL_QUEUE_TIMEOUT_SECONDS="30",
    )


def _old_cut(text: str, window: int) -> int:
    """Where a window was cut before the probe: after the last word break before
    ``len - window``."""
    return max((m.end() for m in re.finditer(r"\s", text[: len(text) - window])), default=0)


def _straddling(entity: str, before: str = "then I wrote to ") -> tuple[str, str]:
    """A first piece of answer that reaches twice the window with its cut inside ``entity``,
    and the rest of the answer."""
    head = FILLER + before
    rest = " about it and " + FILLER * 6
    for extra in range(len(rest)):
        first = head + entity + rest[:extra]
        cut = _old_cut(first, WINDOW)
        if len(first) >= 2 * WINDOW and len(head) < cut < len(head) + len(entity):
            return first, rest[extra:]
    raise AssertionError(f"no cut inside {entity!r}")


def _words(text: str) -> list[str]:
    """The text as a model streams it: a word (and its space) an event."""
    return re.findall(r"\S+\s*|\s+", text)


async def _run_stream(
    url: str, checks: StageChecks, pieces: list[str]
) -> tuple[GuardedStream, bytes]:
    """The stream's answer to a chat stream of ``pieces`` in one chunk, and the stream."""
    async with service_guardrails(url) as guardrails:
        stream = _guarded(guardrails, checks, WINDOW, False)
        out = await stream.feed(_stream(pieces))
        out += await stream.finish()
    return stream, out


def _response(name: str, action: str, **settings: Any) -> StageChecks:
    return StageChecks("response", (CheckSpec(name, action, settings),), ())


@pytest.mark.parametrize(
    ("check", "entity", "marker"),
    [
        (_response("pii", "redact"), "John Smith", "<PERSON>"),
        (_response("pii", "redact"), "5555 5555 5555 4444", "<CREDIT_CARD>"),
        (
            _response("banned_substrings", "redact", substrings=["launch the rockets"]),
            "launch the rockets",
            "<banned_substring>",
        ),
    ],
    ids=["name", "card", "phrase"],
)
def test_an_entity_across_the_window_cut_is_redacted_whole(
    real_service, check: StageChecks, entity: str, marker: str
):
    """GIVEN an answer whose first window would be cut inside a name, a card number written in
    groups, or a banned phrase (each half alone is clean) THEN the client reads the answer
    with the entity redacted whole, and one finding for it."""
    first, rest = _straddling(entity)
    stream, out = asyncio.run(_run_stream(real_service.url, check, [first, *_words(rest)]))
    text, _ = _read(out)
    assert text == (first + rest).replace(entity, marker), text
    [summary] = stream.summaries()
    assert sum(summary["entities"].values()) == 1, summary


def test_a_banned_phrase_across_the_window_cut_blocks_the_stream(real_service):
    """GIVEN response block on a phrase that the first window's cut would split THEN the
    stream ends with the block's error event, and nothing of the phrase went out before."""
    check = _response("banned_substrings", "block", substrings=["launch the rockets"])
    first, rest = _straddling("launch the rockets")
    stream, out = asyncio.run(_run_stream(real_service.url, check, [first, *_words(rest)]))
    events = [e for e in out.split(b"\n\n") if e]
    error = orjson.loads(events[-1].removeprefix(b"data: "))["error"]
    assert error["code"] == "guardrail_blocked"
    assert b"launch" not in out
    assert b"rockets" not in out
    assert stream.summaries()[0]["action"] == "blocked"


def test_entities_at_the_window_cut_are_recorded_once(real_service):
    """GIVEN response flag WHEN one card number lies just before the cut (inside the probed
    region) and another across it THEN the answer goes out unchanged and the stream's record
    counts two cards: the probe's findings are not counted."""
    near = "4111 1111 1111 1111 and then "
    first, rest = _straddling("5555 5555 5555 4444", before="my cards are " + near)
    assert _old_cut(first, WINDOW) - first.index(near) < WINDOW // 2  # in the probed region
    stream, out = asyncio.run(
        _run_stream(real_service.url, _response("pii", "flag"), [first, *_words(rest)])
    )
    text, _ = _read(out)
    assert text == first + rest
    [summary] = stream.summaries()
    assert (summary["action"], summary["entities"]) == ("flagged", {"CREDIT_CARD": 2})


def test_a_long_clean_answer_streams_unchanged_window_by_window(real_service):
    """GIVEN PII redaction WHEN a long answer with nothing to find streams word by word THEN
    it reads unchanged, released in windows as it arrives (not held to the end)."""
    answer = FILLER * 20
    check = StageChecks(
        "response",
        (
            CheckSpec("pii", "redact", {}),
            CheckSpec("banned_substrings", "block", {"substrings": ["launch the rockets"]}),
        ),
        (),
    )
    stream, out = asyncio.run(_run_stream(real_service.url, check, _words(answer)))
    text, (finishes, _) = _read(out)
    assert text == answer
    assert finishes == ["stop"]
    windows = [e for e in out.split(b"\n\n") if b'"content":"' in e and b'"content":""' not in e]
    assert len(windows) >= len(answer) // (2 * WINDOW), len(windows)
    assert not stream.summaries()
