"""Audio transcription: decode, cut at silences, transcribe each piece through the gateway.

``plan`` decodes the original with PyAV (FFmpeg inside the wheel: wav, mp3, m4a, ogg, flac and
whatever else FFmpeg reads) to 16 kHz mono, finds the silences by energy (30 ms frames below
``SILENCE_DB`` under the file's loudest frame, for at least ``MIN_SILENCE_SECONDS``) and cuts
in the middle of them, so no word is split; a stretch with no silence is cut at
``MAX_SEGMENT_SECONDS`` (Whisper's own 30 s window). Pieces that are silence only are
dropped. Each piece is written as a 16-bit WAV under ``out/parts/`` and becomes one part.

``run_part`` posts its WAV to ``/v1/audio/transcriptions`` with the registration's model and
writes ``out/parts/<n>.json`` (start, end, text). ``finish`` writes ``transcript.txt``,
``transcript.json`` (segments with start/end in the file's own time) and ``transcript.vtt``;
the counts are ``{"audio_seconds": …}`` (the decoded duration, rounded up).

Decoding is CPU work in a Celery worker, never on an event loop. An undecodable file fails
the job with a clear reason. So does a file that decodes to longer than its registration said
(``JobContext.audio_seconds``, plus ``MARGIN_RATIO`` and ``MARGIN_SECONDS``): an hour of
silence compresses to a few hundred KB, and would otherwise cost an hour of samples in memory
and the fleet's time. Decoding stops at the bound, without reading the rest.
"""

from __future__ import annotations

import io
import itertools
import math
import wave
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO

import av
import numpy as np
import orjson

from scheduler.files.pipelines.base import (
    GatewayCaller,
    JobContext,
    ObjectStore,
    PartFailed,
    PartResult,
    register,
)

SAMPLE_RATE = 16_000
FRAME_SECONDS = 0.03
SILENCE_DB = 35.0  # a frame this far under the loudest is silence
ABSOLUTE_SILENCE = 1e-4  # RMS under this is silence whatever the file's loudness
MIN_SILENCE_SECONDS = 0.3
MAX_SEGMENT_SECONDS = 30.0
MIN_SEGMENT_SECONDS = 0.1
# A declared duration is often rounded ("about ten minutes"): this much over it is still the
# file that was registered.
MARGIN_RATIO = 0.1
MARGIN_SECONDS = 30.0


def duration_bound(registered_seconds: float) -> float:
    """The longest a file registered as ``registered_seconds`` may decode to."""
    return registered_seconds * (1 + MARGIN_RATIO) + MARGIN_SECONDS


def decode(source: bytes | BinaryIO, *, registered_seconds: float | None = None) -> np.ndarray:
    """16 kHz mono float32 samples of any audio FFmpeg reads; PartFailed if it cannot, or as
    soon as it passes ``duration_bound(registered_seconds)`` (the rest is never decoded)."""
    limit, too_long = None, ""
    if registered_seconds is not None:
        bound = duration_bound(registered_seconds)
        limit = int(bound * SAMPLE_RATE)
        too_long = (
            f"The audio is longer than {bound:.0f} s ({registered_seconds:g} s registered, "
            "plus a margin): refused without decoding the rest. Register the file with its "
            "real duration."
        )
    chunks: list[np.ndarray] = []
    decoded = 0

    def keep(out: av.AudioFrame) -> None:
        nonlocal decoded
        chunk = out.to_ndarray().reshape(-1)
        decoded += len(chunk)
        if limit is not None and decoded > limit:
            raise PartFailed(too_long)
        chunks.append(chunk)

    try:
        content = io.BytesIO(source) if isinstance(source, bytes) else source
        with av.open(content, mode="r") as container:
            if not container.streams.audio:
                raise PartFailed("The file has no audio stream.")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
            for frame in container.decode(audio=0):
                for out in resampler.resample(frame):
                    keep(out)
            for out in resampler.resample(None):
                keep(out)
    except PartFailed:
        raise
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise PartFailed(f"The audio could not be decoded ({type(exc).__name__}).") from exc
    if not chunks:
        raise PartFailed("The audio could not be decoded (no samples).")
    return np.concatenate(chunks).astype(np.float32)


def segments(samples: np.ndarray, rate: int = SAMPLE_RATE) -> list[tuple[int, int]]:
    """(start, end) sample offsets of the pieces to transcribe: cut in the middle of
    silences, never longer than ``MAX_SEGMENT_SECONDS``, silence-only pieces dropped."""
    frame = max(1, int(rate * FRAME_SECONDS))
    count = len(samples) // frame + (1 if len(samples) % frame else 0)
    if count == 0:
        return []
    padded = np.zeros(count * frame, dtype=np.float32)
    padded[: len(samples)] = samples
    rms = np.sqrt(np.mean(padded.reshape(count, frame) ** 2, axis=1))
    loudest = float(rms.max())
    if loudest <= ABSOLUTE_SILENCE:
        return []
    threshold = max(ABSOLUTE_SILENCE, loudest * 10 ** (-SILENCE_DB / 20))
    silent = rms < threshold
    cuts = [0]
    run_start: int | None = None
    min_run = max(1, int(MIN_SILENCE_SECONDS / FRAME_SECONDS))
    for index, quiet in enumerate([*silent.tolist(), False]):
        if quiet and run_start is None:
            run_start = index
        elif not quiet and run_start is not None:
            if index - run_start >= min_run:
                cuts.append(((run_start + index) // 2) * frame)
            run_start = None
    cuts.append(len(samples))
    limit = int(MAX_SEGMENT_SECONDS * rate)
    pieces: list[tuple[int, int]] = []
    for begin, end in itertools.pairwise(cuts):
        while end - begin > limit:  # no silence long enough: fixed-length pieces
            pieces.append((begin, begin + limit))
            begin += limit
        if end > begin:
            pieces.append((begin, end))
    kept = []
    for begin, end in pieces:
        frames = silent[begin // frame : max(begin // frame + 1, math.ceil(end / frame))]
        if (end - begin) >= MIN_SEGMENT_SECONDS * rate and not bool(frames.all()):
            kept.append((begin, end))
    return kept


def wav_bytes(samples: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm)
    return buffer.getvalue()


def _vtt_time(seconds: float) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}.{millis:03d}"


class AudioPipeline:
    kind = "audio"

    def plan(self, job: JobContext, store: ObjectStore) -> list[dict[str, Any]]:
        samples = decode(store.read(job.source_object), registered_seconds=job.audio_seconds)
        duration = len(samples) / SAMPLE_RATE
        specs = []
        for index, (begin, end) in enumerate(segments(samples)):
            name = f"{job.output_prefix}parts/{index:05d}.wav"
            store.write(name, wav_bytes(samples[begin:end]), "audio/wav")
            specs.append(
                {
                    "audio": name,
                    "start": round(begin / SAMPLE_RATE, 3),
                    "end": round(end / SAMPLE_RATE, 3),
                    "duration": round(duration, 3),
                }
            )
        if not specs:
            raise PartFailed("The audio is silent: there is nothing to transcribe.")
        return specs

    def run_part(
        self,
        job: JobContext,
        spec: Mapping[str, Any],
        index: int,
        gateway: GatewayCaller,
        store: ObjectStore,
    ) -> PartResult:
        audio = store.read(str(spec["audio"]))
        answer = gateway.post_multipart(
            "/v1/audio/transcriptions",
            {"model": job.model, "response_format": "json"},
            f"part-{index:05d}.wav",
            audio,
            "audio/wav",
        )
        text = answer.get("text")
        if not isinstance(text, str):
            raise PartFailed("The transcription model answered without text.")
        name = f"{job.output_prefix}parts/{index:05d}.json"
        result = {
            "start": spec["start"],
            "end": spec["end"],
            "duration": spec.get("duration", spec["end"]),
            "text": text.strip(),
        }
        store.write(name, orjson.dumps(result), "application/json")
        usage = answer.get("usage")
        tokens = 0
        if isinstance(usage, dict):
            tokens = int(usage.get("total_tokens") or 0)
        return PartResult(output_object=name, tokens=tokens)

    def finish(
        self, job: JobContext, parts: Sequence[PartResult], store: ObjectStore
    ) -> tuple[dict[str, str], dict[str, int]]:
        pieces = [orjson.loads(store.read(part.output_object)) for part in parts]
        pieces.sort(key=lambda piece: float(piece["start"]))
        found = [piece for piece in pieces if piece["text"]]
        duration = max((float(piece["duration"]) for piece in pieces), default=0.0)
        prefix = job.output_prefix
        text = "\n".join(piece["text"] for piece in found) + "\n"
        document = {
            "text": " ".join(piece["text"] for piece in found),
            "duration": duration,
            "segments": [
                {"id": i, "start": p["start"], "end": p["end"], "text": p["text"]}
                for i, p in enumerate(found)
            ],
        }
        vtt = ["WEBVTT", ""]
        for i, piece in enumerate(found, start=1):
            vtt += [
                str(i),
                f"{_vtt_time(float(piece['start']))} --> {_vtt_time(float(piece['end']))}",
                piece["text"],
                "",
            ]
        outputs = {
            "transcript.txt": f"{prefix}transcript.txt",
            "transcript.json": f"{prefix}transcript.json",
            "transcript.vtt": f"{prefix}transcript.vtt",
        }
        store.write(outputs["transcript.txt"], text.encode(), "text/plain; charset=utf-8")
        store.write(
            outputs["transcript.json"],
            orjson.dumps(document, option=orjson.OPT_INDENT_2),
            "application/json",
        )
        store.write(outputs["transcript.vtt"], "\n".join(vtt).encode(), "text/vtt")
        return outputs, {"audio_seconds": math.ceil(duration)}


register(AudioPipeline())
