"""Token counts read off relayed answers (gateway/usage.py): what accounting and the token
windows' reconciliation are built on."""

from __future__ import annotations

import orjson

from gateway.usage import UsageMeter

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


def metered(chunks: list[bytes], *, streaming: bool = False) -> UsageMeter:
    meter = UsageMeter(streaming=streaming)
    for chunk in chunks:
        meter.feed(chunk)
    meter.finish()
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

    counted = metered([role, token * 3, finish, done], streaming=True)
    assert (counted.completion_tokens, counted.reported) == (3, False)
