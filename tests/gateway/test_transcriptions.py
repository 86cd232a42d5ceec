"""Audio transcriptions through the gateway: multipart relayed, bounded, routed by model."""

from __future__ import annotations

import httpx
import openai
import pytest

from testkit.policy import PolicyBuilder

AUDIO = b"RIFF" + bytes(range(256)) * 64  # any bytes will do for the simulator


@pytest.fixture
def world(valkey_client, start_simulator, start_gateway):
    whisper = start_simulator("whisper-internal", "--kind", "transcription", "--time-scale", "0")
    chat = start_simulator("chat", "--time-scale", "0")
    policy = PolicyBuilder()
    policy.model(
        "whisper",
        [whisper.base_url],
        capabilities=("transcription",),
        served_name="whisper-internal",
    )
    policy.model("chat", [chat.base_url])
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway(SWITCHYARD_GATEWAY_MAX_UPLOAD_BYTES="65536")
    return gateway, key


def test_the_sdk_transcribes_through_the_gateway_with_the_model_renamed(world) -> None:
    gateway, key = world
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)
    result = client.audio.transcriptions.create(
        model="whisper", file=("call.wav", AUDIO, "audio/wav")
    )
    assert result.text


def post(world, files=None, data=None, **kw) -> httpx.Response:
    gateway, key = world
    return httpx.post(
        gateway.base_url + "/v1/audio/transcriptions",
        files=files,
        data=data,
        headers={"Authorization": f"Bearer {key}"},
        **kw,
    )


def test_an_upload_over_the_limit_is_413(world) -> None:
    response = post(world, files={"file": ("big.wav", b"x" * 70_000)}, data={"model": "whisper"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


@pytest.mark.parametrize(
    ("files", "data", "param_or_code"),
    [
        (None, {"model": "whisper"}, "file"),  # no file part
        ({"file": ("a.wav", AUDIO)}, {}, "model"),  # no model
        ({"file": ("a.wav", AUDIO)}, {"model": "chat"}, "unsupported_capability"),
    ],
)
def test_bad_uploads_are_400(world, files, data, param_or_code) -> None:
    if files is None:
        response = post(world, data=data, files={"other": ("x", b"y")})
    else:
        response = post(world, files=files, data=data)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert param_or_code in (error["param"], error["code"])


def test_a_json_body_is_refused_with_a_hint(world) -> None:
    gateway, key = world
    response = httpx.post(
        gateway.base_url + "/v1/audio/transcriptions",
        json={"model": "whisper"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 400
    assert "multipart/form-data" in response.json()["error"]["message"]
