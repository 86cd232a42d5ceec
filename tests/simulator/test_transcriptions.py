"""A speech model (``--kind transcription``): multipart uploads in, deterministic transcripts."""

from __future__ import annotations

import io
import wave
from typing import Any

import pytest

from testkit.stack import RunningSimulator
from tests.conftest import SimulatorFactory
from tests.simulator.client import Reply, call, multipart

TRANSCRIPTIONS = "/v1/audio/transcriptions"
MODEL = "whisper"


def wav(seconds: float, rate: int = 16_000, tone: int = 0) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes([tone % 256, 0]) * int(seconds * rate))
    return out.getvalue()


@pytest.fixture
def sim(start_simulator: SimulatorFactory) -> RunningSimulator:
    return start_simulator(MODEL, "--kind", "transcription", "--time-scale", "0")


def transcribe(
    sim: RunningSimulator,
    audio: bytes | None = None,
    filename: str = "clip.wav",
    **fields: str,
) -> Reply:
    files = {} if audio is None else {"file": (filename, audio, "audio/wav")}
    body, content_type = multipart({"model": MODEL, **fields}, files)
    return call(
        sim.base_url, "POST", TRANSCRIPTIONS, body=body, headers={"Content-Type": content_type}
    )


def ok(reply: Reply) -> dict[str, Any]:
    assert reply.status == 200, reply.body
    body: dict[str, Any] = reply.json()
    return body


def test_a_transcript_is_text_plus_the_audio_duration(sim: RunningSimulator) -> None:
    body = ok(transcribe(sim, wav(2.0)))
    assert list(body) == ["text", "usage"]
    assert body["usage"] == {"type": "duration", "seconds": 2}
    assert len(body["text"].split()) == 5  # 2.5 words a second


def test_the_same_audio_gets_the_same_transcript(sim: RunningSimulator) -> None:
    first = ok(transcribe(sim, wav(3.0)))["text"]
    assert ok(transcribe(sim, wav(3.0)))["text"] == first
    assert ok(transcribe(sim, wav(3.0, tone=7)))["text"] != first


def test_text_format_answers_the_same_json_as_vllm_does(sim: RunningSimulator) -> None:
    assert list(ok(transcribe(sim, wav(1.0), response_format="text"))) == ["text", "usage"]


def test_verbose_json_has_segments_and_the_language(sim: RunningSimulator) -> None:
    body = ok(transcribe(sim, wav(4.0), response_format="verbose_json", language="de"))
    assert list(body) == ["duration", "language", "text", "segments", "words"]
    assert (body["duration"], body["language"]) == (4.0, "de")
    assert body["segments"][0]["text"] == body["text"]


def test_compressed_audio_is_timed_by_its_size(sim: RunningSimulator) -> None:
    body = ok(transcribe(sim, b"\xff\xfb" * 40_000, filename="clip.mp3"))  # 80 kB at 128 kbit/s
    assert body["usage"]["seconds"] == 5


def test_a_request_without_a_file_is_a_validation_error(sim: RunningSimulator) -> None:
    reply = transcribe(sim)
    assert reply.status == 400
    assert reply.json()["error"] == {
        "message": "1 validation error:\n  {'type': 'missing', 'loc': 'body.file', 'msg': "
        "'Field required', 'input': 'None'}",
        "type": "Bad Request",
        "param": "body.file",
        "code": 400,
    }


def test_a_malformed_multipart_body_is_refused(sim: RunningSimulator) -> None:
    reply = call(
        sim.base_url,
        "POST",
        TRANSCRIPTIONS,
        body=b"--abc\r\nno headers here",
        headers={"Content-Type": "multipart/form-data; boundary=abc"},
    )
    assert reply.status == 400
    assert reply.json()["error"]["message"] == "There was an error parsing the body"


@pytest.mark.parametrize(
    ("fields", "audio", "status", "message"),
    [
        ({"model": "nope"}, wav(1.0), 404,
         "The model `nope` does not exist. Valid aliases: whisper."),
        ({"response_format": "srt"}, wav(1.0), 400, "Currently only support response_format: "
         "`text`, `json`, `verbose_json` or `diarized_json`"),
        ({}, b"", 400, "Invalid or empty audio file."),
    ],
)  # fmt: skip
def test_bad_requests_are_refused(
    sim: RunningSimulator, fields: dict[str, str], audio: bytes, status: int, message: str
) -> None:
    reply = transcribe(sim, audio, **fields)
    assert reply.status == status
    assert reply.json()["error"]["message"] == message


def test_a_chat_model_has_no_transcriptions(start_simulator: SimulatorFactory) -> None:
    chat = start_simulator("m")
    body, content_type = multipart({}, {"file": ("a.wav", wav(1.0), "audio/wav")})
    reply = call(
        chat.base_url, "POST", TRANSCRIPTIONS, body=body, headers={"Content-Type": content_type}
    )
    assert (reply.status, reply.body) == (404, b'{"detail":"Not Found"}')
