"""``POST /v1/audio/transcriptions`` for a speech model (Whisper-like).

The "transcript" is deterministic words seeded by the file's bytes, as many as someone
speaking for the file's duration would say. The duration comes from a WAV header when
there is one, else from the size at a typical compressed bitrate.
"""

from __future__ import annotations

import io
import math
import wave
from typing import Any

import orjson

from runtime.multipart import Form
from simulator import tokens
from simulator.asgi import DisconnectWatch, Receive, Send, send_response
from simulator.engine import Sequence
from simulator.errors import ApiError, bad_request, model_not_found, validation_error
from simulator.faults import exit_process_soon, strike_before_work
from simulator.state import Simulator
from simulator.validation import format_error

WORDS_PER_SECOND = 2.5
COMPRESSED_BYTES_PER_SECOND = 16_000  # 128 kbit/s
AUDIO_TOKENS_PER_SECOND = 50  # Whisper's encoder: 1500 positions per 30 s window
MAX_FILE_BYTES = 25 * 1024 * 1024  # vLLM's VLLM_MAX_AUDIO_CLIP_FILESIZE_MB default
RESPONSE_FORMATS = ("json", "text", "verbose_json")


def audio_duration(data: bytes) -> float:
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        try:
            with wave.open(io.BytesIO(data)) as w:
                frames: int = w.getnframes()
                rate: int = w.getframerate()
                return frames / rate
        except (wave.Error, EOFError, ZeroDivisionError):
            pass
    return len(data) / COMPRESSED_BYTES_PER_SECOND


def transcript(data: bytes, duration: float) -> str:
    key = tokens.stable_key("audio", data)
    count = max(1, round(duration * WORDS_PER_SECOND))
    text = tokens.output_text(key, 0, count)
    return " " + text[:1].upper() + text[1:] + "."


def _check_form(form: Form) -> None:
    """FastAPI's Form validation of vLLM's TranscriptionRequest."""
    errors = []
    if "file" not in form.files:
        if "file" in form.fields:
            value = form.fields["file"]
            errors.append(
                format_error(
                    "value_error",
                    "body.file",
                    f"Value error, Expected UploadFile, received: {type(value)}",
                    value,
                    {"error": {}},
                )
            )
        else:
            errors.append(format_error("missing", "body.file", "Field required", None))
    if errors:
        raise validation_error(*errors, param="body.file")


async def serve_transcription(
    sim: Simulator,
    form: Form,
    request_id: str,
    receive: Receive,
    send: Send,
) -> None:
    config = sim.config
    _check_form(form)
    upload = form.files["file"]
    model = form.fields.get("model", "")
    if model and model not in config.served_model_names:
        raise model_not_found(model, config.served_model_names)
    if len(upload.data) > MAX_FILE_BYTES:
        raise bad_request("Maximum file size exceeded", param="file")
    response_format = form.fields.get("response_format", "json")
    if response_format not in RESPONSE_FORMATS:
        raise ApiError(
            "Currently only support response_format: `text`, `json`, `verbose_json` or "
            "`diarized_json`"
        )
    if not upload.data:
        raise bad_request("Invalid or empty audio file.", param="file")
    language = form.fields.get("language") or "en"

    duration = audio_duration(upload.data)
    text = transcript(upload.data, duration)
    word_count = max(1, round(duration * WORDS_PER_SECOND))
    audio_tokens = min(
        config.max_model_len // 2, max(1, math.ceil(duration * AUDIO_TOKENS_PER_SECOND))
    )
    prompt_tokens = audio_tokens + tokens.count_text_tokens(form.fields.get("prompt", ""))
    target = max(1, min(word_count, config.max_model_len - prompt_tokens))

    plan = sim.faults.plan(streaming=False)
    watch = DisconnectWatch(receive)
    try:
        if await strike_before_work(plan, watch, send):
            return
        seq = Sequence(prompt_tokens=prompt_tokens, target_tokens=target, target_reason="stop")
        watch.on_disconnect(lambda: sim.engine.abort(seq))
        sim.engine.submit(seq)
        await seq.wait_finished()
        if seq.finish_reason == "abort":
            return
        watch.cancel()
        payload: dict[str, Any]
        if response_format == "verbose_json":
            payload = {
                "duration": duration,
                "language": language,
                "text": text,
                "segments": [
                    {
                        "id": 0,
                        "avg_logprob": -0.25,
                        "compression_ratio": 1.4,
                        "end": round(duration, 2),
                        "no_speech_prob": None,
                        "seek": 0,
                        "start": 0.0,
                        "temperature": 0.0,
                        "text": text,
                        "tokens": list(range(50365, 50365 + target)),
                    }
                ],
                "words": None,
            }
        else:
            # vLLM answers response_format "text" with the same JSON object as "json".
            payload = {"text": text, "usage": {"type": "duration", "seconds": math.ceil(duration)}}
        await send_response(send, 200, orjson.dumps(payload))
    finally:
        watch.cancel()
        if plan.exit_after_response:
            exit_process_soon()
