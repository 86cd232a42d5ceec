"""What a request may cost in tokens, known before it runs: admission's estimate, per endpoint,
and the completion bound the replica is held to.

The estimate is what the token windows are charged and fair sharing weighs until release
reconciles it with vLLM's own count; it must be near what the request will use. The bytes of
a body are not: a base64 image or a minute of audio is megabytes and a few thousand tokens.
So each endpoint is estimated by what it asks the model to do — text at about four
characters a token, an image part at a fixed cost, audio by its duration — and the
completion once per choice (``n``) and per prompt. All of it reads the document the gateway
has already decoded; nothing is parsed again.
"""

from __future__ import annotations

import io
import math
import wave
from dataclasses import dataclass
from typing import Any

# When the client sets no bound and the model has no cap (the reconcile corrects it).
DEFAULT_COMPLETION_ESTIMATE = 512
# vLLM's (and OpenAI's) max_tokens when a legacy completion sets none.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# An image part, whatever its encoded size: a high-detail tile grid (OpenAI counts 85 + 170
# a tile, ~1,100 for a 1024×1024 image; vision models in vLLM are of the same order).
IMAGE_PART_TOKENS = 1_100
# Whisper-like encoders: 1,500 positions per 30 s window.
AUDIO_TOKENS_PER_SECOND = 50
# Compressed audio (mp3, ogg, m4a) of unknown duration, taken at 128 kbit/s.
COMPRESSED_AUDIO_BYTES_PER_SECOND = 16_000

# Media content parts of a chat message, and where in the part the (data) URL is.
_MEDIA_PARTS = {"image_url": "url", "video_url": "url"}


@dataclass(frozen=True, slots=True)
class Estimate:
    prompt: int
    completion: int

    @property
    def total(self) -> int:
        return self.prompt + self.completion


def estimate_json_request(
    path: str, document: dict[str, Any], body_bytes: int, model_max_tokens: int | None
) -> Estimate:
    """The estimate of a JSON request to ``path``; ``body_bytes`` is its body's length."""
    if path == "/v1/embeddings":
        return Estimate(_text_tokens(body_bytes), 0)
    prompt_chars, media_tokens = body_bytes, 0
    prompts = 1
    if path == "/v1/chat/completions":
        prompt_chars, media_tokens = _chat_media(document, body_bytes)
    else:
        prompt = document.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            prompts = len(prompt)  # a batch of prompts, text or token ids
    choices = document.get("n")
    if not isinstance(choices, int) or isinstance(choices, bool) or choices < 1:
        choices = 1
    completion = completion_bound(path, document, model_max_tokens)
    return Estimate(_text_tokens(prompt_chars) + media_tokens, completion * choices * prompts)


def estimate_transcription(audio: bytes) -> Estimate:
    """An audio upload, by its duration: from a WAV header, else at a compressed bitrate."""
    return Estimate(math.ceil(_audio_seconds(audio) * AUDIO_TOKENS_PER_SECOND), 0)


def completion_bound(path: str, document: dict[str, Any], model_max_tokens: int | None) -> int:
    """The most tokens one choice of this request may generate, as it will be forwarded."""
    asked = _asked_max_tokens(document)
    if asked is None:
        if path == "/v1/completions":
            asked = COMPLETIONS_DEFAULT_MAX_TOKENS
        elif model_max_tokens is None:
            return DEFAULT_COMPLETION_ESTIMATE
    if model_max_tokens is not None:
        asked = model_max_tokens if asked is None else min(asked, model_max_tokens)
    return max(asked or 0, 0)


def max_tokens_override(
    path: str, document: dict[str, Any], model_max_tokens: int | None
) -> tuple[str, int] | None:
    """The member to set so that the replica stops at the model's cap, or None when the
    request as written already does: a client's bound above the cap is lowered to it, and a
    chat request without a bound (vLLM would fill the context) gets the cap. A legacy
    completion without one stops at 16 (vLLM's default), lowered only below that."""
    if model_max_tokens is None or path == "/v1/embeddings":
        return None
    field = "max_completion_tokens" if "max_completion_tokens" in document else "max_tokens"
    if field not in document or document[field] is None:
        if path == "/v1/completions" and model_max_tokens >= COMPLETIONS_DEFAULT_MAX_TOKENS:
            return None
        return field, model_max_tokens
    asked = _asked_max_tokens(document)
    if asked is None or asked <= model_max_tokens:
        return None  # within the cap, or not a number (vLLM refuses it in its own words)
    return field, model_max_tokens


def _asked_max_tokens(document: dict[str, Any]) -> int | None:
    value = document.get("max_completion_tokens", document.get("max_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text_tokens(chars: int) -> int:
    return math.ceil(max(chars, 0) / 4)


def _chat_media(document: dict[str, Any], body_bytes: int) -> tuple[int, int]:
    """The body's characters less its media, and the media's tokens. Only messages whose
    content is a list of parts are looked into (text-only chat costs a type check each)."""
    chars, tokens = body_bytes, 0
    messages = document.get("messages")
    if not isinstance(messages, list):
        return chars, tokens
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind in _MEDIA_PARTS:
                media = part.get(kind)
                url = media.get(_MEDIA_PARTS[kind]) if isinstance(media, dict) else media
                if isinstance(url, str):
                    chars -= len(url)
                tokens += IMAGE_PART_TOKENS
            elif kind == "input_audio":
                audio = part.get("input_audio")
                data = audio.get("data") if isinstance(audio, dict) else None
                if isinstance(data, str):
                    chars -= len(data)
                    seconds = len(data) * 3 / 4 / COMPRESSED_AUDIO_BYTES_PER_SECOND
                    tokens += math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)
    return chars, tokens


def _audio_seconds(audio: bytes) -> float:
    if audio[:4] == b"RIFF" and audio[8:12] == b"WAVE":
        try:
            # Reads the header only; the BytesIO shares the upload's buffer.
            with wave.open(io.BytesIO(audio)) as w:
                frames: int = w.getnframes()
                rate: int = w.getframerate()
                return frames / rate
        except (wave.Error, EOFError, ZeroDivisionError):
            pass
    return len(audio) / COMPRESSED_AUDIO_BYTES_PER_SECOND
