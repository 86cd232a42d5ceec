"""Admission's token estimate, per endpoint, and the completion bound forwarded to vLLM.

Pure functions over the decoded body: examples of each rule the gateway tests exercise end
to end (tests/gateway/test_request_costs.py).
"""

from __future__ import annotations

import base64
import io
import math
import wave
from typing import Any

import orjson

from gateway.costs import (
    AUDIO_TOKENS_PER_SECOND,
    COMPRESSED_AUDIO_BYTES_PER_SECOND,
    DEFAULT_COMPLETION_ESTIMATE,
    IMAGE_PART_TOKENS,
    Estimate,
    estimate_json_request,
    estimate_transcription,
    max_tokens_override,
)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"


def estimate(path: str, document: dict[str, Any], cap: int | None = None) -> Estimate:
    return estimate_json_request(path, document, len(orjson.dumps(document)), cap)


def test_text_is_four_characters_a_token_and_the_completion_its_bound() -> None:
    document = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}
    bounded = {**document, "max_tokens": 100}
    assert estimate(CHAT, bounded).prompt == math.ceil(len(orjson.dumps(bounded)) / 4)
    assert estimate(CHAT, {**document, "max_tokens": 100}).completion == 100
    assert estimate(CHAT, {**document, "max_completion_tokens": 30}).completion == 30
    assert estimate(CHAT, document).completion == DEFAULT_COMPLETION_ESTIMATE
    assert estimate(CHAT, document, cap=64).completion == 64
    assert estimate(CHAT, {**document, "max_tokens": 10**6}, cap=64).completion == 64


def test_an_image_costs_a_fixed_amount_whatever_its_size() -> None:
    def with_image(size: int) -> dict[str, Any]:
        url = "data:image/png;base64," + base64.b64encode(bytes(size)).decode()
        content = [
            {"type": "text", "text": "what?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 1}

    small, large = estimate(CHAT, with_image(1_000)), estimate(CHAT, with_image(3_000_000))
    assert small.prompt == large.prompt
    assert IMAGE_PART_TOKENS < large.prompt < IMAGE_PART_TOKENS + 100


def test_choices_and_prompts_multiply_the_completion() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
    assert estimate(CHAT, {**chat, "n": 4}).completion == 200
    assert estimate(CHAT, {**chat, "n": True}).completion == 50  # not a count: vLLM refuses
    prompts = {"model": "m", "prompt": ["a", "b", "c"], "max_tokens": 50}
    assert estimate(COMPLETIONS, prompts).completion == 150
    assert estimate(COMPLETIONS, {**prompts, "n": 2}).completion == 300
    token_ids = {"model": "m", "prompt": [1, 2, 3, 4], "max_tokens": 50}
    assert estimate(COMPLETIONS, token_ids).completion == 50  # one prompt of token ids
    batch = {"model": "m", "prompt": [[1, 2], [3, 4]], "max_tokens": 50}
    assert estimate(COMPLETIONS, batch).completion == 100
    # A legacy completion without a bound stops at vLLM's default of 16.
    assert estimate(COMPLETIONS, {"model": "m", "prompt": "a"}).completion == 16


def test_embeddings_have_no_completion() -> None:
    assert estimate(EMBEDDINGS, {"model": "e", "input": ["a", "b"]}, cap=4096).completion == 0


def test_audio_costs_its_duration() -> None:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(bytes(2 * 16_000 * 10))
    assert estimate_transcription(buffer.getvalue()) == Estimate(10 * AUDIO_TOKENS_PER_SECOND, 0)
    compressed = bytes(COMPRESSED_AUDIO_BYTES_PER_SECOND * 4)  # no header: 4 s at 128 kbit/s
    assert estimate_transcription(compressed) == Estimate(4 * AUDIO_TOKENS_PER_SECOND, 0)


def test_the_forwarded_bound_never_exceeds_the_models_cap() -> None:
    chat = {"model": "m", "messages": []}
    assert max_tokens_override(CHAT, {**chat, "max_tokens": 50}, 5) == ("max_tokens", 5)
    assert max_tokens_override(CHAT, {**chat, "max_completion_tokens": 50}, 5) == (
        "max_completion_tokens",
        5,
    )
    assert max_tokens_override(CHAT, chat, 5) == ("max_tokens", 5)  # vLLM would fill the context
    assert max_tokens_override(CHAT, {**chat, "max_tokens": 5}, 5) is None
    assert max_tokens_override(CHAT, {**chat, "max_tokens": 50}, None) is None
    assert max_tokens_override(CHAT, {**chat, "max_tokens": "many"}, 5) is None  # vLLM says no
    assert max_tokens_override(COMPLETIONS, {"prompt": "a"}, 4096) is None  # 16 by default
    assert max_tokens_override(COMPLETIONS, {"prompt": "a"}, 8) == ("max_tokens", 8)
    assert max_tokens_override(EMBEDDINGS, {"input": "a"}, 8) is None
