"""The audio pipeline's decoding and cutting, on real encoded files (PyAV's own encoders)."""

from __future__ import annotations

import io
from typing import cast

import av
import numpy as np
import pytest
from av.audio.stream import AudioStream

from scheduler.files.pipelines.audio import MAX_SEGMENT_SECONDS, SAMPLE_RATE, decode, segments
from scheduler.files.pipelines.base import PartFailed

RATE = 48_000


def _signal(tones: list[float], silence: float) -> np.ndarray:
    pieces = []
    for seconds in tones:
        t = np.arange(int(seconds * RATE)) / RATE
        pieces.append(0.4 * np.sin(2 * np.pi * 440 * t))
        pieces.append(np.zeros(int(silence * RATE)))
    return np.concatenate(pieces).astype(np.float32)


def encode(samples: np.ndarray, container: str, codec: str) -> bytes:
    """``samples`` (mono, 48 kHz) encoded by FFmpeg, as a recorder or phone would send."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container) as out:
        stream = cast(AudioStream, out.add_stream(codec, rate=RATE))
        stream.layout = "mono"
        fmt = stream.codec_context.format.name
        frame_size = stream.codec_context.frame_size or 1024
        pts = 0
        for start in range(0, len(samples), frame_size):
            chunk = samples[start : start + frame_size]
            if fmt.startswith("s16"):
                data = (chunk * 32767).astype(np.int16)
            elif fmt.startswith("s32"):
                data = (chunk * 2_147_483_647).astype(np.int32)
            else:
                data = chunk
            frame = av.AudioFrame.from_ndarray(data.reshape(1, -1), format=fmt, layout="mono")
            frame.sample_rate = RATE
            frame.pts = pts
            pts += len(chunk)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("container", "codec"),
    [("flac", "flac"), ("ogg", "libvorbis"), ("mp3", "libmp3lame"), ("ipod", "aac")],
)
def test_common_formats_decode_to_16_khz_mono_and_cut_at_their_silences(
    container: str, codec: str
) -> None:
    content = encode(_signal([1.0, 1.0, 1.0], silence=0.8), container, codec)
    samples = decode(content)
    assert len(samples) / SAMPLE_RATE == pytest.approx(5.4, abs=0.15)
    cuts = [(a / SAMPLE_RATE, b / SAMPLE_RATE) for a, b in segments(samples)]
    assert len(cuts) == 3
    assert [round(a, 1) for a, _ in cuts][1:] == pytest.approx([1.4, 3.2], abs=0.1)


def test_speech_without_a_pause_is_cut_at_fixed_length() -> None:
    samples = decode(encode(_signal([70.0], silence=0.0), "flac", "flac"))
    pieces = segments(samples)
    lengths = [(b - a) / SAMPLE_RATE for a, b in pieces]
    assert len(pieces) == 3
    assert all(length <= MAX_SEGMENT_SECONDS for length in lengths)
    assert sum(lengths) == pytest.approx(70.0, abs=0.05)


def test_silence_only_and_garbage_are_refused_clearly() -> None:
    assert segments(decode(encode(np.zeros(RATE * 2, dtype=np.float32), "flac", "flac"))) == []
    with pytest.raises(PartFailed, match="could not be decoded"):
        decode(b"ID3" + b"\x00" * 2000)
