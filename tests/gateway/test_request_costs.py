"""What a request costs on the token windows before it runs, and what is forwarded for it.

GIVEN a use case with a tokens-per-minute limit, THEN admission estimates each endpoint by
what it asks the model to do — audio by its duration, an image part at a fixed cost, the
completion once per choice (``n``) and per prompt — not by the bytes of the body; a client's
``max_tokens`` above the model's cap is clamped on the way to vLLM; and a request that can
never fit its limit is refused without ``Retry-After`` (SDKs would retry it forever).
"""

from __future__ import annotations

import base64
import io
import wave
from typing import Any

import httpx
import openai
import pytest
import valkey

from gateway.accounting import USAGE_STREAM
from ops.processes import wait_until
from testkit.policy import PolicyBuilder
from testkit.stack import RunningGateway
from tests.conftest import GatewayFactory, SimulatorFactory

CHAT = "llama-test"
WHISPER = "whisper"
TPM = 100_000


def wav(seconds: int, rate: int = 16_000) -> bytes:
    """A real WAV file (mono, 16-bit): 32 kB per second of audio."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(2 * rate * seconds))
    return buffer.getvalue()


@pytest.fixture
def limited(
    valkey_client: valkey.Valkey, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> tuple[RunningGateway, str]:
    """A chat model capped at 5 completion tokens and a speech model, for a use case allowed
    100k tokens a minute."""
    chat = start_simulator(CHAT, "--time-scale", "0")
    whisper = start_simulator(WHISPER, "--kind", "transcription", "--time-scale", "0")
    policy = PolicyBuilder()
    policy.model(CHAT, [chat.base_url], max_tokens=5)
    policy.model(WHISPER, [whisper.base_url], capabilities=("transcription",))
    key = policy.key()
    policy.use_case_limits(key, tokens_per_minute=TPM)
    policy.publish(valkey_client)
    gateway = start_gateway(SWITCHYARD_GATEWAY_MAX_UPLOAD_BYTES=str(4 << 20))
    return gateway, key


def post(gateway: RunningGateway, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        gateway.base_url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def test_an_audio_upload_costs_its_duration_not_its_bytes(limited) -> None:
    """A minute of 16 kHz audio is ~1.9 MB: ~480k tokens by bytes (over the 100k limit,
    refused for good), 3,000 audio tokens by duration."""
    gateway, key = limited
    audio = wav(60)
    assert len(audio) / 4 > TPM
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)
    result = client.audio.transcriptions.create(
        model=WHISPER, file=("call.wav", audio, "audio/wav")
    )
    assert result.text


def test_a_transcription_is_recorded_by_its_duration_as_it_was_estimated(
    limited, valkey_client: valkey.Valkey
) -> None:
    """vLLM reports a transcription's usage as seconds of audio: the record (and the token
    windows' reconcile) counts them as admission did, 50 audio tokens a second, not 0."""
    gateway, key = limited
    response = httpx.post(
        gateway.base_url + "/v1/audio/transcriptions",
        files={"file": ("call.wav", wav(12), "audio/wav")},
        data={"model": WHISPER},
        headers={"Authorization": f"Bearer {key}", "X-Request-Id": "twelve-seconds"},
        timeout=30,
    )
    assert response.status_code == 200
    assert response.json()["usage"] == {"type": "duration", "seconds": 12}

    def record() -> dict[bytes, bytes] | None:
        found = [
            f
            for _, f in valkey_client.xrange(USAGE_STREAM)
            if f[b"request_id"] == b"twelve-seconds"
        ]
        return found[0] if found else None

    assert wait_until(lambda: record() is not None)
    found = record()
    assert found is not None
    assert int(found[b"prompt_tokens"]) == 12 * 50
    assert int(found[b"completion_tokens"]) == 0


def test_an_image_part_costs_a_fixed_amount_not_its_base64(limited) -> None:
    gateway, key = limited
    image = "data:image/png;base64," + base64.b64encode(bytes(600_000)).decode()
    assert len(image) / 4 > TPM
    content = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": image}},
    ]
    response = post(
        gateway,
        key,
        "/v1/chat/completions",
        {"model": CHAT, "messages": [{"role": "user", "content": content}], "max_tokens": 5},
    )
    assert response.status_code == 200, response.text


def never_fits(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert "larger than the limit" in response.json()["error"]["message"]
    # No Retry-After: waiting does not help. And the OpenAI SDKs' own hint not to retry.
    assert "retry-after" not in response.headers
    assert response.headers["x-should-retry"] == "false"


def test_every_choice_and_every_prompt_counts_and_a_request_that_never_fits_is_not_retried(
    valkey_client: valkey.Valkey, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    """Under 1,000 tokens a minute: one completion of 400 tokens fits, four of them (``n``,
    or four prompts) never do, and the answer says so without inviting a retry."""
    chat = start_simulator(CHAT, "--time-scale", "0")
    policy = PolicyBuilder().model(CHAT, [chat.base_url], capabilities=("chat", "completions"))
    key = policy.key()
    policy.use_case_limits(key, tokens_per_minute=1_000)
    policy.publish(valkey_client)
    gateway = start_gateway()
    messages = [{"role": "user", "content": "Tell me a story"}]
    chat_body = {"model": CHAT, "messages": messages, "max_tokens": 400}

    assert post(gateway, key, "/v1/chat/completions", chat_body).status_code == 200
    never_fits(post(gateway, key, "/v1/chat/completions", {**chat_body, "n": 4}))
    prompts = ["Once", "upon", "a", "time"]
    never_fits(
        post(
            gateway,
            key,
            "/v1/completions",
            {"model": CHAT, "prompt": prompts, "max_tokens": 400},
        )
    )


def test_max_tokens_above_the_models_cap_is_clamped_on_the_way_to_vllm(limited) -> None:
    """The model is capped at 5 completion tokens: a client asking for more, or setting no
    bound at all, gets 5 (``ignore_eos``: the simulator generates up to the bound it got)."""
    gateway, key = limited
    messages = [{"role": "user", "content": "Count to a hundred"}]
    bodies: dict[str, dict[str, Any]] = {
        "max_tokens": {"max_tokens": 50},
        "max_completion_tokens": {"max_completion_tokens": 50},
        "none": {},
    }
    for name, bound in bodies.items():
        body = {"model": CHAT, "messages": messages, "ignore_eos": True, **bound}
        response = post(gateway, key, "/v1/chat/completions", body)
        assert response.status_code == 200, (name, response.text)
        assert response.json()["usage"]["completion_tokens"] == 5, name
    within = {"model": CHAT, "messages": messages, "ignore_eos": True, "max_tokens": 3}
    response = post(gateway, key, "/v1/chat/completions", within)
    assert response.json()["usage"]["completion_tokens"] == 3
