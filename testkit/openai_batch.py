"""Helpers for tests of the OpenAI Files and Batch APIs: batch input lines, and the OpenAI SDK
pointed at a gateway (the lead's round-trip tests build their client with ``sdk_client``)."""

from __future__ import annotations

from typing import Any

import orjson
from openai import OpenAI


def chat_line(
    custom_id: str, model: str = "llama", text: str = "Hello", **extra: Any
) -> dict[str, Any]:
    """One request of a batch input, as OpenAI documents it."""
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": text}], **extra},
    }


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def sdk_client(gateway_url: str, api_key: str) -> OpenAI:
    """The OpenAI SDK against a Switchyard gateway, with no retries (a test sees every answer)."""
    return OpenAI(base_url=f"{gateway_url}/v1", api_key=api_key, max_retries=0, timeout=30)
