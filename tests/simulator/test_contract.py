"""vLLM's HTTP contract, as the gateway relies on it.

Every test here must pass against a real vLLM too (``make test-live`` runs this file against
vLLM 0.32 on the CPU), so nothing below depends on what the simulator generates: requests use
``ignore_eos`` so both stop at ``max_tokens``, and text is only checked for its type.
"""

from __future__ import annotations

import re
from typing import Any

import openai
import pytest

from tests.simulator.client import Reply, call, get, post
from tests.simulator.conftest import Target

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "Name three colours."}]
ID_BODY = r"[0-9a-f]{16}"
FINGERPRINT = r"vllm-\d+\.\d+\.\d+\S*-[0-9a-f]{8}"
JSON_HEADERS = ["date", "server", "content-length", "content-type", "vary"]

CHAT_KEYS = [
    "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
    "usage", "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
    "ec_transfer_params", "metrics",
]  # fmt: skip
CHAT_CHOICE_KEYS = [
    "index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids", "routed_experts"
]  # fmt: skip
MESSAGE_KEYS = ["role", "content", "refusal", "annotations", "audio", "function_call", "reasoning"]
USAGE_KEYS = [
    "prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
    "completion_tokens_details",
]  # fmt: skip
COMPLETION_KEYS = [
    "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
    "usage", "kv_transfer_params", "ec_transfer_params", "metrics",
]  # fmt: skip
COMPLETION_CHOICE_KEYS = [
    "index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids",
    "prompt_logprobs", "prompt_token_ids", "routed_experts",
]  # fmt: skip


def chat(target: Target, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": target.model,
        "messages": MESSAGES,
        "max_tokens": 5,
        "temperature": 0,
        "ignore_eos": True,
    }
    body.update(extra)
    return body


def completion(target: Target, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": target.model,
        "prompt": "The three primary colours are",
        "max_tokens": 5,
        "temperature": 0,
        "ignore_eos": True,
    }
    body.update(extra)
    return body


def assert_error(reply: Reply, status: int, err_type: str, param: str | None = None) -> str:
    """vLLM's error shape; returns the message for further checks."""
    assert reply.status == status, reply.body
    assert list(reply.headers) == JSON_HEADERS
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert list(body) == ["error"]
    assert list(body["error"]) == ["message", "type", "param", "code"]
    assert body["error"]["type"] == err_type
    assert body["error"]["code"] == status
    assert body["error"]["param"] == param
    message: str = body["error"]["message"]
    return message


# -- service endpoints ---------------------------------------------------------------------


def test_health_is_an_empty_200(target: Target) -> None:
    reply = get(target.base_url, "/health")
    assert (reply.status, reply.body) == (200, b"")
    assert list(reply.headers) == ["date", "server", "content-length", "vary"]
    assert (reply.headers["server"], reply.headers["vary"]) == ("uvicorn", "Origin")


def test_health_does_not_answer_head(target: Target) -> None:
    reply = call(target.base_url, "HEAD", "/health")
    assert reply.status == 405
    assert reply.headers["allow"] == "GET"


def test_version_names_a_version(target: Target) -> None:
    reply = get(target.base_url, "/version")
    assert reply.status == 200
    assert list(reply.json()) == ["version"]
    assert re.match(r"\d+\.\d+", reply.json()["version"])


def test_models_lists_the_served_model_as_a_vllm_model_card(target: Target) -> None:
    reply = get(target.base_url, "/v1/models")
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert list(body) == ["object", "data"]
    assert body["object"] == "list"
    card = body["data"][0]
    assert list(card) == [
        "id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"
    ]  # fmt: skip
    assert (card["id"], card["object"], card["owned_by"]) == (target.model, "model", "vllm")
    assert isinstance(card["max_model_len"], int)
    permission = card["permission"][0]
    assert re.fullmatch(rf"modelperm-{ID_BODY}", permission["id"])
    assert permission["object"] == "model_permission"


# -- chat completions ----------------------------------------------------------------------


def test_a_chat_completion_has_vllms_fields_in_vllms_order(target: Target) -> None:
    reply = post(target.base_url, CHAT, chat(target))
    assert reply.status == 200, reply.body
    assert list(reply.headers) == JSON_HEADERS
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert list(body) == CHAT_KEYS
    assert re.fullmatch(FINGERPRINT, body["system_fingerprint"])
    assert re.fullmatch(rf"chatcmpl-{ID_BODY}", body["id"])
    assert (body["object"], body["model"]) == ("chat.completion", target.model)
    assert isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert list(choice) == CHAT_CHOICE_KEYS
    assert list(choice["message"]) == MESSAGE_KEYS
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert (choice["index"], choice["finish_reason"], choice["stop_reason"]) == (0, "length", None)
    usage = body["usage"]
    assert list(usage) == USAGE_KEYS
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5


def test_the_x_request_id_header_becomes_the_completion_id(target: Target) -> None:
    reply = post(target.base_url, CHAT, chat(target), headers={"X-Request-Id": "trace-42"})
    assert reply.json()["id"] == "chatcmpl-trace-42"


def test_n_gives_n_choices_and_counts_all_their_tokens(target: Target) -> None:
    reply = post(target.base_url, CHAT, chat(target, n=2, temperature=1.0, seed=7))
    body = reply.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 10


def test_a_missing_model_means_the_served_one(target: Target) -> None:
    body = chat(target)
    del body["model"]
    reply = post(target.base_url, CHAT, body)
    assert reply.status == 200, reply.body
    assert reply.json()["model"] == target.model


def test_unknown_fields_and_roles_are_accepted(target: Target) -> None:
    messages = [{"role": "wizard", "content": "Hi"}]
    reply = post(target.base_url, CHAT, chat(target, messages=messages, foo_bar=1))
    assert reply.status == 200, reply.body


def test_prompt_plus_max_tokens_beyond_the_context_is_capped_not_refused(target: Target) -> None:
    # Token ids, so that both servers count the same prompt length.
    prompt = [1] * (target.max_model_len - 3)
    reply = post(target.base_url, COMPLETIONS, completion(target, prompt=prompt, max_tokens=50))
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["usage"]["completion_tokens"] == 3
    assert body["usage"]["total_tokens"] == target.max_model_len
    assert body["choices"][0]["finish_reason"] == "length"


def test_a_chat_stream_is_role_then_content_then_finish_then_usage_then_done(
    target: Target,
) -> None:
    reply = post(
        target.base_url, CHAT, chat(target, stream=True, stream_options={"include_usage": True})
    )
    assert reply.status == 200
    assert list(reply.headers) == ["date", "server", "content-type", "vary", "transfer-encoding"]
    assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert reply.headers["transfer-encoding"] == "chunked"
    chunks = reply.chunks()
    role, *content, usage = chunks

    assert list(role) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "prompt_token_ids",
        "prompt_text",
    ]
    assert role["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert re.fullmatch(rf"chatcmpl-{ID_BODY}", role["id"])
    assert {c["id"] for c in chunks} == {role["id"]}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}

    *middle, last = content
    for chunk in middle:
        assert list(chunk) == ["id", "object", "created", "model", "choices"]
        (choice,) = chunk["choices"]
        assert list(choice) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
        assert list(choice["delta"]) == ["content"]
        assert choice["finish_reason"] is None
    assert len(content) == 5  # one chunk per token
    assert list(last) == ["id", "object", "created", "model", "choices"]
    (final,) = last["choices"]
    assert list(final) == [
        "index",
        "delta",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
    ]
    assert (final["finish_reason"], final["stop_reason"]) == ("length", None)

    assert list(usage) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "system_fingerprint",
    ]
    assert usage["choices"] == []
    assert list(usage["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens"]
    assert usage["usage"]["completion_tokens"] == 5
    assert re.fullmatch(FINGERPRINT, usage["system_fingerprint"])


def test_a_stream_without_include_usage_ends_on_the_finish_chunk(target: Target) -> None:
    chunks = post(target.base_url, CHAT, chat(target, stream=True)).chunks()
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert list(last) == ["id", "object", "created", "model", "choices", "system_fingerprint"]
    assert all("usage" not in c for c in chunks)


def test_continuous_usage_puts_running_usage_on_every_chunk(target: Target) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = post(target.base_url, CHAT, chat(target, stream=True, stream_options=options)).chunks()
    role, *content, final = chunks
    assert list(role) == [
        "id", "object", "created", "model", "choices", "usage", "prompt_token_ids", "prompt_text"
    ]  # fmt: skip
    running = [c["usage"] for c in [role, *content]]
    assert [u["completion_tokens"] for u in running] == [0, 1, 2, 3, 4, 5]
    assert all(
        list(u)
        == ["prompt_tokens", "total_tokens", "completion_tokens", "completion_tokens_details"]
        for u in running
    )
    assert list(final["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens"]


def test_n_streams_announce_every_choice_first(target: Target) -> None:
    body = chat(target, stream=True, n=2, temperature=1.0, max_tokens=2)
    chunks = post(target.base_url, CHAT, body).chunks()
    assert [c["choices"][0]["delta"].get("role") for c in chunks[:2]] == ["assistant"] * 2
    assert [c["choices"][0]["index"] for c in chunks[:2]] == [0, 1]
    finished = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(finished) == [0, 1]


def test_streamed_and_unstreamed_answers_count_the_same_prompt(target: Target) -> None:
    whole = post(target.base_url, CHAT, chat(target)).json()
    streamed = post(
        target.base_url, CHAT, chat(target, stream=True, stream_options={"include_usage": True})
    ).chunks()
    assert streamed[-1]["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]


def test_priority_is_accepted_under_the_priority_policy(target: Target) -> None:
    reply = post(target.base_url, CHAT, chat(target, priority=-5))
    assert reply.status == 200, reply.body


def test_stop_and_seed_are_accepted(target: Target) -> None:
    reply = post(target.base_url, CHAT, chat(target, stop=["\n\n"], seed=3, temperature=0.7))
    assert reply.status == 200, reply.body
    assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_the_openai_sdk_reads_answers_and_streams(target: Target) -> None:
    client = openai.OpenAI(base_url=f"{target.base_url}/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model=target.model,
        messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=4,
        extra_body={"ignore_eos": True},
    )
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 4
    stream = client.chat.completions.create(
        model=target.model,
        messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4


# -- text completions ----------------------------------------------------------------------


def test_a_completion_has_vllms_fields_in_vllms_order(target: Target) -> None:
    reply = post(target.base_url, COMPLETIONS, completion(target))
    assert reply.status == 200, reply.body
    body = reply.json()
    assert list(body) == COMPLETION_KEYS
    assert re.fullmatch(FINGERPRINT, body["system_fingerprint"])
    assert re.fullmatch(rf"cmpl-{ID_BODY}", body["id"])
    assert body["object"] == "text_completion"
    (choice,) = body["choices"]
    assert list(choice) == COMPLETION_CHOICE_KEYS
    assert isinstance(choice["text"], str)
    assert choice["finish_reason"] == "length"
    assert list(body["usage"]) == USAGE_KEYS
    assert body["usage"]["completion_tokens"] == 5


def test_a_completion_stream_has_text_chunks_then_usage_then_done(target: Target) -> None:
    reply = post(
        target.base_url,
        COMPLETIONS,
        completion(target, stream=True, stream_options={"include_usage": True}),
    )
    assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
    *content, usage = reply.chunks()
    for chunk in content:
        assert list(chunk) == ["id", "object", "created", "model", "choices"]
        assert chunk["object"] == "text_completion"
        assert list(chunk["choices"][0]) == [
            "index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids",
            "token_ids",
        ]  # fmt: skip
    assert len(content) == 5
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert list(usage) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "system_fingerprint",
    ]
    assert usage["usage"]["completion_tokens"] == 5


def test_completions_stop_at_16_tokens_by_default(target: Target) -> None:
    body = completion(target)
    del body["max_tokens"]
    reply = post(target.base_url, COMPLETIONS, body)
    assert reply.json()["usage"]["completion_tokens"] == 16


def test_a_prompt_of_token_ids_is_accepted(target: Target) -> None:
    reply = post(target.base_url, COMPLETIONS, completion(target, prompt=[1, 2, 3, 4, 5, 6]))
    assert reply.status == 200, reply.body
    assert reply.json()["usage"]["prompt_tokens"] == 6


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/nothing-here", "/", "/v1/models/x", "/v1/embeddings"])
def test_an_unknown_path_is_fastapis_404(target: Target, path: str) -> None:
    for method in ("GET", "POST"):
        reply = call(target.base_url, method, path)
        assert reply.status == 404
        assert list(reply.headers) == JSON_HEADERS
        assert reply.body == b'{"detail":"Not Found"}'


@pytest.mark.parametrize(
    ("method", "path", "allow"), [("GET", CHAT, "POST"), ("POST", "/v1/models", "GET")]
)
def test_a_wrong_method_is_fastapis_405(target: Target, method: str, path: str, allow: str) -> None:
    reply = call(target.base_url, method, path)
    assert reply.status == 405
    assert list(reply.headers) == [
        "date",
        "server",
        "allow",
        "content-length",
        "content-type",
        "vary",
    ]
    assert reply.headers["allow"] == allow
    assert reply.body == b'{"detail":"Method Not Allowed"}'


def test_an_unknown_model_is_a_404_naming_the_valid_ones(target: Target) -> None:
    reply = post(target.base_url, CHAT, chat(target, model="no-such-model"))
    message = assert_error(reply, 404, "NotFoundError", "model")
    assert message == f"The model `no-such-model` does not exist. Valid aliases: {target.model}."


def test_invalid_json_is_a_400_validation_error(target: Target) -> None:
    body = b'{"model": "m", "messages": ['
    reply = call(
        target.base_url, "POST", CHAT, body=body, headers={"Content-Type": "application/json"}
    )
    message = assert_error(reply, 400, "Bad Request", "body.28")
    assert message == (
        "1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.28', 'msg': 'JSON decode "
        "error', 'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting value'}}"
    )


def test_an_empty_body_is_a_400(target: Target) -> None:
    reply = call(
        target.base_url, "POST", CHAT, body=b"", headers={"Content-Type": "application/json"}
    )
    message = assert_error(reply, 400, "Bad Request", "body")
    assert message == (
        "1 validation error:\n  {'type': 'missing', 'loc': 'body', 'msg': 'Field required', "
        "'input': 'None'}"
    )


def test_a_body_that_is_not_an_object_is_a_400(target: Target) -> None:
    message = assert_error(post(target.base_url, CHAT, [1, 2]), 400, "Bad Request", "body")
    assert "'type': 'model_attributes_type'" in message
    assert "'input': '<list of 2 items>'" in message


def test_a_body_that_is_not_json_typed_is_a_400(target: Target) -> None:
    reply = call(target.base_url, "POST", CHAT, body=b"{}", headers={"Content-Type": "text/plain"})
    message = assert_error(reply, 400, "Bad Request")
    assert message == (
        "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
    )


def test_missing_messages_is_a_400_naming_the_field(target: Target) -> None:
    reply = post(target.base_url, CHAT, {"model": target.model})
    message = assert_error(reply, 400, "Bad Request", "body.messages")
    assert message == (
        "1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', "
        "'msg': 'Field required', 'input': '<dict of 1 items>'}"
    )


def test_a_field_of_the_wrong_type_is_a_400_naming_the_field(target: Target) -> None:
    reply = post(target.base_url, CHAT, chat(target, priority=1.5))
    message = assert_error(reply, 400, "Bad Request", "body.priority")
    assert message == (
        "1 validation error:\n  {'type': 'int_from_float', 'loc': 'body.priority', 'msg': "
        "'Input should be a valid integer, got a number with a fractional part', 'input': '1.5'}"
    )


def test_every_bad_field_is_reported_and_the_first_is_the_param(target: Target) -> None:
    reply = post(
        target.base_url, CHAT, {"model": target.model, "messages": "x", "temperature": "hot"}
    )
    message = assert_error(reply, 400, "Bad Request", "body.messages")
    assert message == (
        "2 validation errors:\n"
        "  {'type': 'list_type', 'loc': 'body.messages', 'msg': 'Input should be a valid list', "
        "'input': 'x'}\n"
        "  {'type': 'float_parsing', 'loc': 'body.temperature', 'msg': 'Input should be a valid "
        "number, unable to parse string as a number', 'input': 'hot'}"
    )


def test_a_message_without_a_role_is_a_400(target: Target) -> None:
    reply = post(target.base_url, CHAT, chat(target, messages=[{"content": "Hi"}]))
    param = "body.messages.0.ChatCompletionDeveloperMessageParam.role"
    message = assert_error(reply, 400, "Bad Request", param)
    assert message.startswith("11 validation errors:\n  {'type': 'missing', 'loc': " + repr(param))
    assert message.endswith("\n  ...and 1 more errors")


def test_an_empty_conversation_is_a_400(target: Target) -> None:
    message = assert_error(
        post(target.base_url, CHAT, chat(target, messages=[])), 400, "BadRequestError"
    )
    assert message == (
        "Cannot apply chat template to an empty conversation. Provide at least one message."
    )


def test_a_completion_without_a_prompt_is_a_400(target: Target) -> None:
    reply = post(target.base_url, COMPLETIONS, {"model": target.model})
    message = assert_error(reply, 400, "BadRequestError", "prompt")
    assert message == (
        "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"
    )


def test_a_prompt_longer_than_the_context_is_a_400(target: Target) -> None:
    limit = target.max_model_len
    long_prompt = "hello " * (limit * 2)
    for path, body in [
        (COMPLETIONS, completion(target, prompt=long_prompt)),
        (CHAT, chat(target, messages=[{"role": "user", "content": long_prompt}])),
    ]:
        message = assert_error(
            post(target.base_url, path, body), 400, "BadRequestError", "input_tokens"
        )
        assert message == (
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains at least {limit + 1} input tokens, which exceeds this limit even without "
            "any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={limit + 1})"
        )


def test_max_tokens_beyond_the_context_is_a_400(target: Target) -> None:
    too_many = target.max_model_len + 1
    reply = post(target.base_url, CHAT, chat(target, max_tokens=too_many))
    message = assert_error(reply, 400, "BadRequestError", "max_tokens")
    assert message == (
        f"max_tokens={too_many} cannot be greater than max_model_len={target.max_model_len}. "
        f"Please request fewer output tokens. (parameter=max_tokens, value={too_many})"
    )


@pytest.mark.parametrize(
    ("extra", "param", "expected"),
    [
        ({"n": 0}, None, "n must be at least 1, got 0."),
        (
            {"temperature": -1},
            "temperature",
            "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
        ),
        ({"top_p": 2}, "top_p", "top_p must be in (0, 1], got 2.0. (parameter=top_p, value=2.0)"),
        (
            {"max_tokens": 0},
            "max_tokens",
            "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
        ),
    ],
)
def test_invalid_sampling_parameters_are_a_400(
    target: Target, extra: dict[str, Any], param: str | None, expected: str
) -> None:
    reply = post(target.base_url, CHAT, chat(target, **extra))
    assert assert_error(reply, 400, "BadRequestError", param) == expected


def test_stream_options_without_stream_is_a_400(target: Target) -> None:
    reply = post(target.base_url, CHAT, chat(target, stream_options={"include_usage": True}))
    message = assert_error(reply, 400, "BadRequestError", "stream_options")
    assert message == (
        "Stream options can only be defined when `stream=True`. (parameter=stream_options)"
    )


# -- metrics -------------------------------------------------------------------------------

GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
COUNTERS = [
    "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success",
    "vllm:num_preemptions", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
]  # fmt: skip
HISTOGRAMS = [
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
]  # fmt: skip


def scrape(target: Target) -> str:
    reply = get(target.base_url, "/metrics")
    assert reply.status == 200
    assert reply.headers["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
    return reply.body.decode()


def sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name} {labels}")


def test_metrics_have_vllms_names_types_and_labels(target: Target) -> None:
    reply = get(target.base_url, "/metrics")
    assert list(reply.headers) == JSON_HEADERS
    text = scrape(target)
    labels = f'engine="0",model_name="{target.model}"'
    for name in GAUGES:
        assert f"# TYPE {name} gauge" in text
        assert re.search(rf"^{re.escape(name)}\{{{labels}\}} ", text, re.M), name
    for name in COUNTERS:
        # prometheus_client names the family with or without _total depending on its version
        assert re.search(rf"^# TYPE {re.escape(name)}(_total)? counter$", text, re.M), name
        assert f"{name}_total{{" in text
    for name in HISTOGRAMS:
        assert f"# TYPE {name} histogram" in text
        assert f'{name}_bucket{{engine="0",le="+Inf",model_name="{target.model}"}}' in text
    for reason in ("stop", "length", "abort"):
        assert f'finished_reason="{reason}"' in text


def test_metrics_count_the_requests_served(target: Target) -> None:
    before = scrape(target)
    post(target.base_url, CHAT, chat(target))
    after = scrape(target)

    def grew(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert grew("vllm:request_success_total", finished_reason="length") == 1
    assert grew("vllm:generation_tokens_total") == 5
    assert grew("vllm:prompt_tokens_total") > 0
    assert grew("vllm:e2e_request_latency_seconds_count") == 1
    assert grew("vllm:time_to_first_token_seconds_count") == 1
    assert sample(after, "vllm:num_requests_running") == 0


# --- logprobs --------------------------------------------------------------------------------
LOGPROB_KEYS = ["token", "logprob", "bytes", "top_logprobs"]
COMPLETION_LOGPROB_KEYS = ["text_offset", "token_logprobs", "tokens", "top_logprobs"]


def assert_chat_logprob(entry: dict[str, Any], top: int) -> None:
    """One token of ``ChatCompletionLogProbs.content``: the sampled token's text, logprob and
    UTF-8 bytes, and ``top`` alternatives, the sampled token first (vLLM's dict order)."""
    assert list(entry) == LOGPROB_KEYS
    assert isinstance(entry["token"], str)
    assert isinstance(entry["logprob"], float)
    assert entry["logprob"] <= 0
    assert entry["bytes"] == list(entry["token"].encode("utf-8", errors="replace"))
    assert len(entry["top_logprobs"]) == top
    for alternative in entry["top_logprobs"]:
        assert list(alternative) == ["token", "logprob", "bytes"]
        assert alternative["bytes"] == list(alternative["token"].encode("utf-8", errors="replace"))
    if top:
        first = entry["top_logprobs"][0]
        assert (first["token"], first["logprob"]) == (entry["token"], entry["logprob"])


def test_a_chat_answer_with_logprobs_has_one_entry_per_token(target: Target) -> None:
    """GIVEN logprobs with two alternatives WHEN the answer has five tokens THEN
    ``choice.logprobs`` is ``{"content": [...]}`` with five entries of vLLM's shape."""
    answer = post(target.base_url, CHAT, chat(target, logprobs=True, top_logprobs=2)).json()
    (choice,) = answer["choices"]
    assert list(choice["logprobs"]) == ["content"]
    content = choice["logprobs"]["content"]
    assert len(content) == answer["usage"]["completion_tokens"] == 5
    for entry in content:
        assert_chat_logprob(entry, top=2)


def test_chat_logprobs_without_top_logprobs_list_no_alternatives(target: Target) -> None:
    answer = post(target.base_url, CHAT, chat(target, logprobs=True)).json()
    content = answer["choices"][0]["logprobs"]["content"]
    assert len(content) == 5
    for entry in content:
        assert_chat_logprob(entry, top=0)


def test_an_answer_without_logprobs_asked_carries_none(target: Target) -> None:
    chat_answer = post(target.base_url, CHAT, chat(target, logprobs=False)).json()
    text_answer = post(target.base_url, COMPLETIONS, completion(target)).json()
    assert chat_answer["choices"][0]["logprobs"] is None
    assert text_answer["choices"][0]["logprobs"] is None


def test_a_completion_with_logprobs_lists_tokens_offsets_and_alternatives(
    target: Target,
) -> None:
    """GIVEN completions ``logprobs: 2`` THEN ``CompletionLogProbs``: parallel lists, text
    offsets counting the tokens' characters from 0, and per token a dict of at most k + 1
    alternatives (vLLM keeps ranks 0..k) that holds the sampled token."""
    answer = post(target.base_url, COMPLETIONS, completion(target, logprobs=2)).json()
    (choice,) = answer["choices"]
    logprobs = choice["logprobs"]
    assert list(logprobs) == COMPLETION_LOGPROB_KEYS
    tokens, values = logprobs["tokens"], logprobs["token_logprobs"]
    assert len(tokens) == len(values) == len(logprobs["top_logprobs"]) == 5
    offsets = [0]
    for token in tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs["text_offset"] == offsets
    for token, value, top in zip(tokens, values, logprobs["top_logprobs"], strict=True):
        assert isinstance(value, float)
        assert value <= 0
        assert 1 <= len(top) <= 3
        assert top[token] == value


def test_a_chat_stream_carries_each_tokens_logprobs_on_its_chunk(target: Target) -> None:
    """GIVEN a streamed chat answer with logprobs THEN the role chunk has none and each
    token's chunk carries ``{"content": [its entry]}`` for the token it adds."""
    chunks = post(
        target.base_url, CHAT, chat(target, stream=True, logprobs=True, top_logprobs=1)
    ).chunks()
    role, *content = chunks
    assert role["choices"][0]["logprobs"] is None
    assert len(content) == 5
    for chunk in content:
        (choice,) = chunk["choices"]
        (entry,) = choice["logprobs"]["content"]
        assert_chat_logprob(entry, top=1)
        assert entry["token"] == choice["delta"]["content"]


def test_a_completion_stream_carries_each_tokens_logprobs_with_running_offsets(
    target: Target,
) -> None:
    chunks = post(
        target.base_url, COMPLETIONS, completion(target, stream=True, logprobs=0)
    ).chunks()
    assert len(chunks) == 5
    offset = 0
    for chunk in chunks:
        (choice,) = chunk["choices"]
        logprobs = choice["logprobs"]
        assert list(logprobs) == COMPLETION_LOGPROB_KEYS
        (token,) = logprobs["tokens"]
        assert logprobs["text_offset"] == [offset]
        assert list(logprobs["top_logprobs"][0]) == [token]
        offset += len(token)


_TOO_MANY = "Requested sample logprobs of 21, which is greater than max allowed: 20"


@pytest.mark.parametrize(
    ("path", "extra", "param", "message"),
    [
        (
            CHAT,
            {"top_logprobs": 2},
            "top_logprobs",
            "when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
        ),
        (
            CHAT,
            {"logprobs": True, "top_logprobs": -2},
            "top_logprobs",
            "`top_logprobs` must be a positive value or -1. (parameter=top_logprobs, value=-2)",
        ),
        (
            CHAT,
            {"logprobs": True, "top_logprobs": 21},
            "logprobs",
            f"{_TOO_MANY} (parameter=logprobs, value=21)",
        ),
        (COMPLETIONS, {"logprobs": 21}, "logprobs", f"{_TOO_MANY} (parameter=logprobs, value=21)"),
        (
            COMPLETIONS,
            {"logprobs": -3},
            "logprobs",
            "`logprobs` must be a positive value or -1. (parameter=logprobs, value=-3)",
        ),
    ],
)
def test_logprob_counts_beyond_what_vllm_allows_are_a_400(
    target: Target, path: str, extra: dict[str, Any], param: str, message: str
) -> None:
    body = chat(target, **extra) if path == CHAT else completion(target, **extra)
    reply = post(target.base_url, path, body)
    assert assert_error(reply, 400, "BadRequestError", param) == message
