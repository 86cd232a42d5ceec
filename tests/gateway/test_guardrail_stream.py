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


async def _relay(url: str, raw: bytes, cuts: list[int], window: int, strip: bool) -> bytes:
    async with service_guardrails(url) as guardrails:
        stream = GuardedStream(
            path="/v1/chat/completions",
            checks=CHECKS,
            guardrails=guardrails,
            window_chars=window,
            failure="closed",
            strip_usage=strip,
            document={},
        )
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
