"""Token counts read off relayed answers (gateway/usage.py): what accounting and the token
windows' reconciliation are built on."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.usage import UsageEventFilter, UsageMeter, asks_for_usage, with_usage_requested

# The shape vLLM 0.32 answers a chat completion in: usage after the choices, extension fields
# after it.
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": 'He said "usage": {"prompt_tokens": 1}'},
            "finish_reason": "stop",
        }
    ],
    "usage": {
        "prompt_tokens": 21,
        "total_tokens": 33,
        "completion_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 16},
        "completion_tokens_details": None,
    },
    "kv_transfer_params": {"usage": {"prompt_tokens": 999}},
}


def metered(
    chunks: list[bytes], *, streaming: bool = False, prompt_estimate: int = 0
) -> UsageMeter:
    meter = UsageMeter(streaming=streaming)
    for chunk in chunks:
        meter.feed(chunk)
    meter.finish(prompt_estimate=prompt_estimate)
    return meter


def test_a_plain_answers_usage_is_its_top_level_one_whatever_else_says_usage():
    body = orjson.dumps(ANSWER)
    for chunks in ([body], [body[:50], body[50:300], body[300:]]):
        meter = metered(chunks)
        assert (meter.prompt_tokens, meter.completion_tokens, meter.reported) == (21, 12, True)


def test_an_unusual_usage_shape_is_still_read_by_parsing_the_whole_answer():
    deep = {**ANSWER, "usage": {"prompt_tokens": 5, "completion_tokens": 7, "x": {"y": {}}}}
    meter = metered([orjson.dumps(deep)])
    assert (meter.prompt_tokens, meter.completion_tokens, meter.reported) == (5, 7, True)


def test_no_usage_null_usage_or_no_json_count_nothing():
    for body in (
        orjson.dumps({k: v for k, v in ANSWER.items() if k != "usage"}),
        orjson.dumps({**ANSWER, "usage": None}),
        b"Internal Server Error",
        b"[1, 2]",
    ):
        meter = metered([body])
        assert (meter.prompt_tokens, meter.completion_tokens, meter.reported) == (0, 0, False)


def test_a_stream_reports_its_usage_chunk_or_else_counts_token_chunks():
    role = b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
    token = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3}}\n\n'
    done = b"data: [DONE]\n\n"
    finish = b'data: {"choices":[{"delta":{},"finish_reason":"length"}]}\n\n'

    reported = metered([role, token * 3, finish, usage[:20], usage[20:], done], streaming=True)
    assert (reported.prompt_tokens, reported.completion_tokens) == (9, 3)

    unterminated = metered([role, token, usage.rstrip(b"\n")], streaming=True)
    assert (unterminated.prompt_tokens, unterminated.completion_tokens) == (9, 3)

    counted = metered([role, token * 3, finish, done], streaming=True, prompt_estimate=40)
    assert (counted.completion_tokens, counted.reported) == (3, False)
    # No usage reported: the prompt counts at admission's estimate, never as free.
    assert counted.prompt_tokens == 40
    reported = metered([role, token, usage, done], streaming=True, prompt_estimate=40)
    assert reported.prompt_tokens == 9


ROLE = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
USAGE_EVENT = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}\n\n'
DONE = b"data: [DONE]\n\n"


def filtered(stream: bytes, cut: int) -> bytes:
    strip = UsageEventFilter()
    return strip(stream[:cut]) + strip(stream[cut:]) + strip.flush()


def test_the_usage_event_is_taken_out_wherever_reads_cut_the_stream():
    stream = ROLE + TOKEN + TOKEN + USAGE_EVENT + DONE
    for cut in range(len(stream) + 1):
        assert filtered(stream, cut) == ROLE + TOKEN + TOKEN + DONE, cut
    # SSE's other line ending, and JSON written with spaces (not vLLM's, other servers').
    spaced = USAGE_EVENT.replace(b'"choices":[]', b'"choices": []')
    crlf = (ROLE + TOKEN + spaced + DONE).replace(b"\n", b"\r\n")
    for cut in range(len(crlf) + 1):
        assert filtered(crlf, cut) == (ROLE + TOKEN + DONE).replace(b"\n", b"\r\n"), cut


def test_only_the_usage_event_goes_and_whole_events_are_never_held():
    strip = UsageEventFilter()
    # Whole events pass at once, unchanged.
    assert strip(ROLE + TOKEN) == ROLE + TOKEN
    # An event with empty choices and no usage, and data that is not JSON, are not usage.
    empty = b'data: {"id":"c","choices":[],"note":"keep"}\n\n'
    odd = b'data: {"choices":[] not json\n\n'
    assert strip(empty + odd) == empty + odd
    # A half event waits for its blank line (an SSE client could not act on it sooner).
    assert strip(TOKEN[:10]) == b""
    assert strip(TOKEN[10:]) == TOKEN
    # An unfinished event left at the end goes out, unless it is the usage event.
    assert strip(b"data: tail") == b""
    assert strip.flush() == b"data: tail"
    strip(USAGE_EVENT.rstrip(b"\n"))
    assert strip.flush() == b""


def test_the_usage_chunk_is_asked_for_only_where_vllm_would_not_send_it():
    # vLLM's rule: a non-empty stream_options whose include_usage is not false.
    assert asks_for_usage({"stream_options": {"include_usage": True}})
    assert asks_for_usage({"stream_options": {"continuous_usage_stats": True}})
    declined: list[dict[str, Any]] = [
        {},
        {"stream_options": {}},
        {"stream_options": {"include_usage": False}},
        {"stream_options": None},
    ]
    for document in declined:
        assert not asks_for_usage(document), document

    body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"a } b"}]}'
    spliced = with_usage_requested(body, orjson.loads(body))
    assert spliced is not None
    assert spliced.startswith(body[:-1])  # the client's bytes are kept as they were
    assert orjson.loads(spliced) == {
        **orjson.loads(body),
        "stream_options": {"include_usage": True},
    }
    own = {"model": "m", "stream": True, "stream_options": {"include_usage": False, "x": 1}}
    rewritten = with_usage_requested(orjson.dumps(own), own)
    assert rewritten is not None
    assert orjson.loads(rewritten)["stream_options"] == {"include_usage": True, "x": 1}
    not_an_object = {"model": "m", "stream": True, "stream_options": "yes"}
    assert with_usage_requested(orjson.dumps(not_an_object), not_an_object) is None
