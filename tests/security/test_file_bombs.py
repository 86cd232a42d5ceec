"""A file job's work is bounded by what was registered, and one bad file cannot stall the rest
(issue 24, defect 7).

GIVEN acme's ``transcribe`` use case (tests/scheduler/files/test_file_jobs.py's world: a real
gateway in front of real simulators, real Valkey, the files bucket on SeaweedFS)
WHEN it uploads a small file that decodes to far more than it registered (an hour of FLAC
silence registered as five seconds, a PDF whose one page inflates to 40 MiB, a PDF of many
more pages than declared), or a file whose pipeline's plan raises
THEN each of those jobs ends ``failed`` with a reason that says why, decoding stops as soon as
the bound is passed, a plan that keeps raising is tried a bounded number of times, and the
other tenants' jobs beside them still run to ``done``.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, cast

import av
import numpy as np
import pytest
import valkey
from av.audio.stream import AudioStream
from pypdf import PdfWriter
from pypdf.generic import DictionaryObject, EncodedStreamObject, NameObject

from governance.choices import FileState
from governance.models import FileRegistration
from scheduler.files import feasibility
from scheduler.files.pipelines.audio import decode
from scheduler.files.pipelines.base import (
    PIPELINES,
    GatewayCaller,
    JobContext,
    ObjectStore,
    PartFailed,
    PartResult,
)
from testkit.file_jobs_world import make_pdf, make_wav, register, run_in_process, upload
from tests.scheduler.files import conftest as scheduler_conftest
from tests.scheduler.files import test_file_jobs

pytestmark = pytest.mark.django_db

# The file-job world of tests/scheduler/files/, reused as it is.
files_bucket = scheduler_conftest.files_bucket
world = test_file_jobs.world

BOMB_RATE = 8_000


def silence_bomb(minutes: float) -> bytes:
    """One second of tone, then ``minutes`` of digital silence, as FLAC: each silent block is
    a constant subframe of a few bytes, so an hour is a few hundred KB that decodes to an hour."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="flac") as out:
        stream = cast(AudioStream, out.add_stream("flac", rate=BOMB_RATE))
        stream.layout = "mono"
        fmt = stream.codec_context.format.name
        size = stream.codec_context.frame_size or 4096
        t = np.arange(BOMB_RATE) / BOMB_RATE
        tone = (0.5 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int16)
        blocks = [tone[i : i + size] for i in range(0, len(tone), size)]
        blocks += [np.zeros(size, dtype=np.int16)] * int(minutes * 60 * BOMB_RATE / size)
        pts = 0
        for block in blocks:
            frame = av.AudioFrame.from_ndarray(block.reshape(1, -1), format=fmt, layout="mono")
            frame.sample_rate = BOMB_RATE
            frame.pts = pts
            pts += len(block)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def deflate_bomb_pdf(mebibytes: int) -> bytes:
    """A one-page PDF with a real text layer whose content stream inflates to ``mebibytes``
    MiB (of spaces after the text): a few dozen KB on disk."""
    compressor = zlib.compressobj(9)
    pieces = [compressor.compress(b"BT /F1 12 Tf 72 720 Td (quarterly figures) Tj ET\n")]
    spaces = b" " * (1 << 20)
    pieces += [compressor.compress(spaces) for _ in range(mebibytes)]
    pieces.append(compressor.flush())
    writer = PdfWriter()
    page = writer.add_blank_page(612, 792)
    font = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Helvetica"),
        }
    )
    page[NameObject("/Resources")] = DictionaryObject(
        {NameObject("/Font"): DictionaryObject({NameObject("/F1"): writer._add_object(font)})}
    )
    contents = EncodedStreamObject()
    contents._data = b"".join(pieces)
    contents[NameObject("/Filter")] = NameObject("/FlateDecode")
    page[NameObject("/Contents")] = writer._add_object(contents)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


class CountingReader(io.BytesIO):
    """The file as the decoder reads it, counting the bytes it asked for."""

    consumed = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.consumed += len(chunk)
        return chunk


def _ended(registration: FileRegistration) -> FileRegistration:
    registration.refresh_from_db()
    return registration


def test_an_audio_file_decoding_far_past_its_registration_fails_early(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    """GIVEN an hour of FLAC silence after one beep, registered as five seconds, and a
    well-formed recording beside it WHEN both are uploaded and the beat runs THEN the bomb
    fails with a reason naming the registered duration, its promise is released, and the
    recording is transcribed."""
    bomb = silence_bomb(60)
    assert len(bomb) < 1024 * 1024  # small on the wire
    bad = register(
        world["use_case"],
        world["whisper"],
        "audio",
        "bomb.flac",
        bomb,
        declared_seconds=5.0,
        sla_class=world["hourly"],
    )
    recording = make_wav([0.8, 0.6])
    good = register(
        world["use_case"],
        world["whisper"],
        "audio",
        "call.wav",
        recording,
        declared_seconds=3.0,
        sla_class=world["hourly"],
    )
    upload(valkey_client, bad, bomb)
    upload(valkey_client, good, recording)

    ran = run_in_process(valkey_client)

    assert ran.outcomes == {bad.pk: FileState.FAILED, good.pk: FileState.DONE}
    failure = _ended(bad).failure
    assert "longer than" in failure
    assert "5 s registered" in failure
    assert not valkey_client.hexists(feasibility.ledger_key("whisper"), str(bad.pk))


def test_decoding_stops_at_the_bound_without_reading_the_whole_bomb() -> None:
    """GIVEN the same hour of silence WHEN it is decoded against a registered five seconds
    THEN decoding is refused having read a small part of the file."""
    bomb = silence_bomb(60)
    reader = CountingReader(bomb)
    with pytest.raises(PartFailed, match="longer than"):
        decode(reader, registered_seconds=5.0)
    assert reader.consumed < len(bomb) // 10


def test_a_pdf_whose_page_inflates_to_tens_of_mebibytes_fails_with_the_reason(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    """GIVEN a 40 KB PDF whose one page's content inflates to 40 MiB (under pypdf's own
    default limits) WHEN it is uploaded and the beat runs THEN the job fails saying the PDF
    is too large to read, and nothing of it reaches the model."""
    bomb = deflate_bomb_pdf(40)
    assert len(bomb) < 100 * 1024
    registration = register(
        world["use_case"], world["llama"], "pdf", "report.pdf", bomb, sla_class=world["hourly"]
    )
    upload(valkey_client, registration, bomb)

    ran = run_in_process(valkey_client)

    assert ran.outcomes == {registration.pk: FileState.FAILED}
    assert "too large to read" in _ended(registration).failure


def test_a_pdf_of_far_more_pages_than_declared_fails_before_extraction(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    """GIVEN a PDF registered as two pages that holds 400 WHEN it is uploaded and the beat
    runs THEN the job fails naming both page counts."""
    pdf = make_pdf(["page"] * 400)
    registration = register(
        world["use_case"],
        world["llama"],
        "pdf",
        "deck.pdf",
        pdf,
        declared_pages=2,
        sla_class=world["hourly"],
    )
    upload(valkey_client, registration, pdf)

    ran = run_in_process(valkey_client)

    assert ran.outcomes == {registration.pk: FileState.FAILED}
    failure = _ended(registration).failure
    assert "400 pages" in failure
    assert "2 registered" in failure


class ExplodingPlan:
    """A pipeline whose plan raises what no pipeline anticipated (a library bug, a crash in a
    decoder): the runner must contain it."""

    kind = "text"

    def __init__(self) -> None:
        self.plans = 0

    def plan(self, job: JobContext, store: ObjectStore) -> list[dict[str, Any]]:
        self.plans += 1
        raise RuntimeError("decoder exploded")

    def run_part(
        self,
        job: JobContext,
        spec: Mapping[str, Any],
        index: int,
        gateway: GatewayCaller,
        store: ObjectStore,
    ) -> PartResult:
        raise AssertionError("a job that could not be planned has no parts to run")

    def finish(
        self, job: JobContext, parts: Sequence[PartResult], store: ObjectStore
    ) -> tuple[dict[str, str], dict[str, int]]:
        raise AssertionError("a job that could not be planned is not finished")


def test_a_plan_that_keeps_raising_fails_its_job_and_the_others_still_run(
    world: dict[str, Any],
    valkey_client: valkey.Valkey,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GIVEN a text file whose pipeline's plan raises every time, due first, and a PDF of
    another kind due later WHEN the beat runs turn after turn THEN the text job is planned at
    most ``FILE_JOB_PLAN_ATTEMPTS`` times and ends failed with the reason, its promise
    released, and the PDF job is done."""
    settings.FILE_JOB_PLAN_ATTEMPTS = 3
    exploding = ExplodingPlan()
    monkeypatch.setitem(PIPELINES, "text", exploding)
    text = b"minutes of the meeting\n"
    bad = register(
        world["use_case"], world["llama"], "text", "notes.txt", text, sla_class=world["quick"]
    )
    pdf = make_pdf(["Invoice 1: 100 EUR"])
    good = register(
        world["use_case"], world["llama"], "pdf", "invoice.pdf", pdf, sla_class=world["hourly"]
    )
    upload(valkey_client, bad, text)
    upload(valkey_client, good, pdf)

    outcomes: dict[int, list[str]] = {bad.pk: [], good.pk: []}
    for _ in range(6):  # more turns than attempts: a job that never ends would show here
        for pk, outcome in run_in_process(valkey_client).outcomes.items():
            outcomes[pk].append(outcome)

    assert outcomes[good.pk][-1] == FileState.DONE
    assert outcomes[bad.pk][-1] == FileState.FAILED
    assert exploding.plans == 3
    failure = _ended(bad).failure
    assert "could not be planned" in failure
    assert "RuntimeError" in failure
    assert _ended(good).state == FileState.DONE
    assert not valkey_client.hexists(feasibility.ledger_key("llama"), str(bad.pk))
