"""vLLM's JSON shapes for completions and chat completions, key for key and in vLLM's order.

vLLM serializes non-streaming responses with pydantic's ``model_dump()`` (every field, nulls
included), stream chunks with ``exclude_unset=True`` (only the fields its code sets, even
when set to null), and the trailing usage chunk with ``exclude_none=True``. Those three
rules are why the dicts below carry the nulls they do (see tests/live/OBSERVED.md).
"""

from __future__ import annotations

from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"

Json = dict[str, Any]


def sse(payload: Json) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> Json:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def short_usage(prompt_tokens: int, completion_tokens: int) -> Json:
    """Usage as the final stream chunk carries it: null details are dropped."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def running_usage(prompt_tokens: int, completion_tokens: int, *, chat: bool) -> Json:
    """``continuous_usage_stats``: chat sets completion_tokens_details (to null), text does not."""
    body = short_usage(prompt_tokens, completion_tokens)
    if chat:
        body["completion_tokens_details"] = None
    return body


# -- chat ----------------------------------------------------------------------------------


def chat_choice(
    index: int,
    text: str,
    finish_reason: str,
    stop_reason: str | None,
    logprobs: Json | None = None,
) -> Json:
    return {
        "index": index,
        "message": {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        },
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": None,
        "routed_experts": None,
    }


def chat_response(
    request_id: str,
    created: int,
    model: str,
    choices: list[Json],
    prompt_tokens: int,
    completion_tokens: int,
    fingerprint: str,
) -> Json:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage(prompt_tokens, completion_tokens),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def chat_role_chunk(
    request_id: str, created: int, model: str, index: int, running: Json | None
) -> Json:
    chunk: Json = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    if running is not None:
        chunk["usage"] = running
    chunk["prompt_token_ids"] = None
    chunk["prompt_text"] = None
    return chunk


def chat_chunk(
    request_id: str,
    created: int,
    model: str,
    index: int,
    text: str,
    finish_reason: str | None,
    stop_reason: str | None,
    running: Json | None,
    fingerprint: str | None,
    logprobs: Json | None = None,
) -> Json:
    choice: Json = {
        "index": index,
        "delta": {"content": text},
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }
    if finish_reason is not None:
        choice["stop_reason"] = stop_reason
    choice["token_ids"] = None
    chunk: Json = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if running is not None:
        chunk["usage"] = running
    if fingerprint is not None:
        chunk["system_fingerprint"] = fingerprint
    return chunk


# -- completions ---------------------------------------------------------------------------


def completion_choice(
    index: int,
    text: str,
    finish_reason: str,
    stop_reason: str | None,
    logprobs: Json | None = None,
) -> Json:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
    }


def completion_response(
    request_id: str,
    created: int,
    model: str,
    choices: list[Json],
    prompt_tokens: int,
    completion_tokens: int,
    fingerprint: str,
) -> Json:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage(prompt_tokens, completion_tokens),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def completion_chunk(
    request_id: str,
    created: int,
    model: str,
    index: int,
    text: str,
    finish_reason: str | None,
    stop_reason: str | None,
    running: Json | None,
    fingerprint: str | None,
    logprobs: Json | None = None,
) -> Json:
    chunk: Json = {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
                "prompt_token_ids": None,
                "token_ids": None,
            }
        ],
    }
    if running is not None:
        chunk["usage"] = running
    if fingerprint is not None:
        chunk["system_fingerprint"] = fingerprint
    return chunk


def usage_chunk(
    request_id: str,
    created: int,
    model: str,
    prompt_tokens: int,
    completion_tokens: int,
    fingerprint: str,
    *,
    chat: bool,
) -> Json:
    return {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": short_usage(prompt_tokens, completion_tokens),
        "system_fingerprint": fingerprint,
    }
