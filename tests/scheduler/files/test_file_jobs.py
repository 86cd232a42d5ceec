"""File jobs from the upload event to their outputs, every part real but the worker: a real
gateway in front of real simulators (transcription, chat, embeddings), real Valkey, the files
bucket on SeaweedFS. The beat's two tasks and the job run in the test's process here
(tests/scheduler/files/test_file_jobs_worker.py runs them in a Celery worker).

Personas: the ``acme/transcribe`` use case uploads recordings and documents.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import httpx
import orjson
import pytest
import valkey

from governance.choices import FileState
from governance.job_keys import DEFAULT_JOB_KEY_CLASS, job_key, job_key_hash
from governance.models import AuditEvent, FileRegistration
from governance.snapshot import snapshot_build, snapshot_publish
from ops.processes import wait_until
from scheduler.files import feasibility
from scheduler.files.feasibility import Job
from scheduler.files.gateway_client import GatewayClient
from scheduler.files.objects import FilesStore
from scheduler.files.pipelines.base import PartFailed
from scheduler.files.upload_events import UPLOADS_GROUP, UPLOADS_STREAM
from scheduler.files.uploads import uploads_consume
from scheduler.models import FilePart, PartState
from testkit.factories import make_key, make_model, make_tenant, make_use_case
from testkit.file_jobs_world import (
    make_pdf,
    make_wav,
    register,
    run_in_process,
    seed_priority,
    sla_class,
    upload,
)
from tests.conftest import GatewayFactory, SimulatorFactory
from tests.scheduler.files.conftest import FilesBucket

pytestmark = pytest.mark.django_db

TONES = [1.0, 1.5, 0.7]  # three utterances, each followed by 0.8 s of silence


@pytest.fixture
def world(
    settings: Any,
    valkey_url: str,
    valkey_client: valkey.Valkey,
    files_bucket: FilesBucket,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
) -> dict[str, Any]:
    settings.VALKEY_URL = valkey_url
    settings.FILE_JOB_PART_CONCURRENCY = 2
    settings.FILE_JOB_RETRY_MAX_SECONDS = 1.0
    settings.BATCH_DEFAULT_TOKENS_PER_SECOND = 1000.0
    settings.BATCH_CAPACITY_SHARE = 0.5  # the figures below were set against half of it
    settings.FILE_JOBS_START_LAG_SECONDS = 0.0  # the ledger arithmetic here plans from now
    classes = seed_priority(batch_queue_timeout=0.3)
    whisper_sim = start_simulator("whisper", "--kind", "transcription", "--time-scale", "0")
    llama_sim = start_simulator("llama")
    embed_sim = start_simulator("embed", "--kind", "embedding", "--time-scale", "0")
    whisper = make_model("whisper", [whisper_sim.base_url], capabilities=["transcription"])
    # One request at a time on llama: a long interactive answer holds the replica, so a job's
    # call behind it waits in the gateway's queue, at its own class.
    llama = make_model("llama", [llama_sim.base_url], capabilities=["chat"])
    llama.deployments.update(max_in_flight_per_replica=1)
    embed = make_model("embed", [embed_sim.base_url], capabilities=["embeddings"])
    acme = make_tenant("acme")
    use_case = make_use_case(acme, "transcribe", models=(whisper, llama, embed))
    hourly = sla_class(use_case, "hourly", classes["low"], turnaround_seconds=300)
    quick = sla_class(use_case, "quick", classes["batch"], turnaround_seconds=300)
    _, interactive = make_key(use_case)
    # a use case with no embedding model and no SLA class: explicit deadlines only
    notes = make_use_case(acme, "notes", models=(llama,))
    snapshot_publish()
    gateway = start_gateway()
    settings.FILE_JOBS_GATEWAY_URL = gateway.base_url
    return {
        "use_case": use_case,
        "notes": notes,
        "whisper": whisper,
        "llama": llama,
        "hourly": hourly,
        "quick": quick,
        "gateway": gateway.base_url,
        "interactive": interactive,
        "llama_sim": llama_sim,
        "classes": classes,
    }


def _audit(registration: FileRegistration) -> list[str]:
    return list(
        AuditEvent.objects.filter(object_id=str(registration.pk), action__startswith="file")
        .order_by("sequence")
        .values_list("action", flat=True)
    )


def test_an_uploaded_recording_is_cut_at_its_silences_and_transcribed(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    """GIVEN a registered recording of three utterances WHEN it is uploaded and the beat runs
    THEN it moves uploaded → queued → running → done, the turnaround restarts at the upload,
    each utterance is one part, the transcript's segments carry the file's own times, the
    progress is 1 and the promise is released."""
    audio = make_wav(TONES)
    registration = register(
        world["use_case"],
        world["whisper"],
        "audio",
        "call-0001.wav",
        audio,
        declared_seconds=5.0,
        sla_class=world["hourly"],
    )
    ledger = feasibility.ledger_key("whisper")
    assert valkey_client.hexists(ledger, str(registration.pk))
    event = upload(valkey_client, registration, audio, at=datetime.now(UTC).timestamp() - 30)

    ran = run_in_process(valkey_client)

    assert ran.dispatched == [registration.pk]
    assert ran.outcomes == {registration.pk: FileState.DONE}
    registration.refresh_from_db()
    assert registration.state == FileState.DONE
    assert registration.progress == 1.0
    assert registration.source_object == event.object_name
    assert registration.source_sha256 == event.sha256
    assert registration.source_bytes == len(audio)
    uploaded_at = datetime.fromtimestamp(event.uploaded_at, UTC)
    assert registration.uploaded_at == uploaded_at
    assert registration.promised_by == uploaded_at + timedelta(seconds=300)
    assert _audit(registration) == [
        "file.register",
        "fileregistration.uploaded",
        "fileregistration.queued",
        "fileregistration.running",
        "fileregistration.done",
    ]
    parts = list(FilePart.objects.filter(registration=registration).order_by("index"))
    assert [p.state for p in parts] == [PartState.DONE] * 3
    assert all(p.attempts == 1 for p in parts)
    prefix = event.object_name.rsplit("/", 1)[0] + "/out/"
    assert registration.outputs == {
        "transcript.txt": prefix + "transcript.txt",
        "transcript.json": prefix + "transcript.json",
        "transcript.vtt": prefix + "transcript.vtt",
    }
    store = FilesStore()
    transcript = orjson.loads(store.read(registration.outputs["transcript.json"]))
    starts = [segment["start"] for segment in transcript["segments"]]
    # cut in the middle of each 0.8 s silence: after 1.0 + 0.4 s and 1.0 + 0.8 + 1.5 + 0.4 s
    assert starts[0] == 0.0
    assert starts[1] == pytest.approx(1.4, abs=0.05)
    assert starts[2] == pytest.approx(3.7, abs=0.05)
    assert all(segment["text"] for segment in transcript["segments"])
    text = store.read(registration.outputs["transcript.txt"]).decode()
    assert text.splitlines() == [segment["text"] for segment in transcript["segments"]]
    vtt = store.read(registration.outputs["transcript.vtt"]).decode()
    assert vtt.startswith("WEBVTT\n\n1\n00:00:00.000 --> 00:00:01.410\n")
    assert registration.counts["audio_seconds"] == 6  # 5.6 s of audio, rounded up
    assert registration.counts["parts"] == 3
    assert not valkey_client.hexists(ledger, str(registration.pk))


def test_a_pdf_and_a_text_file_are_extracted_chunked_embedded_and_summarised(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    pages = [f"Page {n}: policy 44{n} covers water damage up to {n}000 francs." for n in range(7)]
    pdf = make_pdf(pages)
    text = ("The adjuster visited the house on Tuesday. " * 40 + "\n") * 30
    by_pdf = register(
        world["use_case"],
        world["llama"],
        "pdf",
        "claim.pdf",
        pdf,
        declared_pages=7,
        sla_class=world["hourly"],
    )
    by_pdf.metadata = {"prompt": "List the policy numbers."}
    by_pdf.save(update_fields=["metadata"])
    by_text = register(
        world["use_case"],
        world["llama"],
        "text",
        "notes.txt",
        text.encode(),
        sla_class=world["hourly"],
    )
    upload(valkey_client, by_pdf, pdf)
    upload(valkey_client, by_text, text.encode())

    ran = run_in_process(valkey_client)

    assert ran.outcomes == {by_pdf.pk: FileState.DONE, by_text.pk: FileState.DONE}
    store = FilesStore()
    by_pdf.refresh_from_db()
    assert set(by_pdf.outputs) == {"text.txt", "chunks.jsonl", "summary.json"}
    assert store.read(by_pdf.outputs["text.txt"]).decode().split("\n\n") == pages
    rows = [
        orjson.loads(line) for line in store.read(by_pdf.outputs["chunks.jsonl"]).split(b"\n")[:-1]
    ]
    assert [row["page"] for row in rows] == list(range(1, 8))
    assert all(len(row["embedding"]) == 384 for row in rows)
    summary = orjson.loads(store.read(by_pdf.outputs["summary.json"]))
    assert [part["pages"] for part in summary["parts"]] == [[1, 5], [6, 7]]
    assert all(part["summary"] for part in summary["parts"])
    assert by_pdf.counts["pages"] == 7
    assert by_pdf.counts["chunks"] == 7
    by_text.refresh_from_db()
    chunks = [
        orjson.loads(line) for line in store.read(by_text.outputs["chunks.jsonl"]).split(b"\n")[:-1]
    ]
    assert len(chunks) == by_text.counts["chunks"] > 30
    assert all(len(chunk["text"]) <= 1000 for chunk in chunks)
    assert store.read(by_text.outputs["text.txt"]).decode() == text


@pytest.mark.parametrize(
    ("kind", "filename", "content", "reason"),
    [
        ("text", "blob.txt", b"\x89PNG\r\n\x1a\n\x00\x00", "binary"),
        ("pdf", "scan.pdf", make_pdf(["", ""]), "no text layer"),
        ("audio", "noise.wav", b"RIFF-but-not-really" * 50, "could not be decoded"),
    ],
)
def test_a_file_its_pipeline_cannot_read_fails_with_the_reason(
    world: dict[str, Any],
    valkey_client: valkey.Valkey,
    kind: str,
    filename: str,
    content: bytes,
    reason: str,
) -> None:
    model = world["whisper"] if kind == "audio" else world["llama"]
    registration = register(
        world["use_case"], model, kind, filename, content, sla_class=world["hourly"]
    )
    upload(valkey_client, registration, content)

    ran = run_in_process(valkey_client)

    assert ran.outcomes == {registration.pk: FileState.FAILED}
    registration.refresh_from_db()
    assert reason in registration.failure
    assert _audit(registration)[-1] == "fileregistration.failed"
    assert not valkey_client.hexists(feasibility.ledger_key(model.public_id), str(registration.pk))


def test_a_duplicate_or_stray_upload_event_is_only_acknowledged(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    audio = make_wav([0.5])
    registration = register(
        world["use_case"], world["whisper"], "audio", "a.wav", audio, sla_class=world["hourly"]
    )
    cancelled = register(
        world["use_case"], world["whisper"], "audio", "b.wav", audio, sla_class=world["hourly"]
    )
    from scheduler.files.registration import file_cancel
    from testkit.file_jobs_world import SYSTEM

    file_cancel(actor=SYSTEM, file=cancelled)
    event = upload(valkey_client, registration, audio)
    upload(valkey_client, cancelled, audio)
    valkey_client.xadd(
        UPLOADS_STREAM, {"registration": "999999", "object": "x", "bytes": "1", "at": "1.0"}
    )
    valkey_client.xadd(UPLOADS_STREAM, {"garbage": "yes"})

    first = uploads_consume(client=valkey_client)
    from scheduler.files.upload_events import publish_upload

    publish_upload(valkey_client, event)  # at-least-once: delivered again
    second = uploads_consume(client=valkey_client)

    assert (first.queued, first.acked_only) == (1, 3)
    assert (second.queued, second.acked_only) == (0, 1)
    assert _audit(registration).count("fileregistration.uploaded") == 1
    cancelled.refresh_from_db()
    assert cancelled.state == FileState.CANCELLED
    pending = cast(dict[str, Any], valkey_client.xpending(UPLOADS_STREAM, UPLOADS_GROUP))
    assert pending["pending"] == 0


def test_a_file_uploaded_late_on_a_busy_model_is_kept_and_marked_at_risk(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    """GIVEN a registration promised at once WHEN, before its upload, the model's ledger fills
    with work due earlier THEN the upload still queues it, with the turnaround from the upload,
    its entry is in the ledger (later checks count it) and the audit trail says it is at risk."""
    audio = make_wav([0.5])
    registration = register(
        world["use_case"],
        world["whisper"],
        "audio",
        "late.wav",
        audio,
        declared_seconds=600,  # 15,000 tokens: 30 s of the model's batch share
        sla_class=world["hourly"],
    )
    now = datetime.now(UTC).timestamp()
    rate = 1000.0 * 0.5
    feasibility.record(
        valkey_client,
        "whisper",
        # Due after it, and so full that the late file's 30 s before it make it late; alone
        # it has 15 s to spare, for the start lag and a loaded machine's slow steps (2 s was
        # not enough under five test processes on two cores).
        Job("other", tokens=rate * 305, deadline=now + 320, intervals=((now, now + 320),)),
    )
    event = upload(valkey_client, registration, audio)

    report = uploads_consume(client=valkey_client)

    assert (report.queued, report.at_risk) == (1, 1)
    registration.refresh_from_db()
    assert registration.state == FileState.QUEUED
    deadline = datetime.fromtimestamp(event.uploaded_at, UTC) + timedelta(seconds=300)
    assert registration.promised_by == deadline
    entry = Job.decode(
        str(registration.pk),
        valkey_client.hget(feasibility.ledger_key("whisper"), str(registration.pk)),  # type: ignore[arg-type]
    )
    assert entry.deadline == pytest.approx(deadline.timestamp())
    at_risk = AuditEvent.objects.get(action="file.at_risk", object_id=str(registration.pk))
    assert at_risk.after is not None
    assert at_risk.after["promised_by"] == deadline.isoformat()


def _hold_llama(world: dict[str, Any]) -> threading.Thread:
    """An interactive answer that keeps llama's only slot busy for a few seconds."""

    def ask() -> None:
        httpx.post(
            world["gateway"] + "/v1/chat/completions",
            json={
                "model": "llama",
                "messages": [{"role": "user", "content": "Tell a long story."}],
                "max_tokens": 400,
                "min_tokens": 400,
            },
            headers={"authorization": f"Bearer {world['interactive']}"},
            timeout=60,
        )

    holder = threading.Thread(target=ask)
    holder.start()
    metrics = world["llama_sim"].base_url + "/metrics"
    assert wait_until(
        lambda: (
            'vllm:num_requests_running{engine="0",model_name="llama"} 1.0'
            in httpx.get(metrics).text
        ),
        timeout=10,
        interval=0.02,
    )
    return holder


def test_a_part_refused_with_503_is_retried_and_then_succeeds(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    """GIVEN llama's only slot held by interactive traffic and the ``quick`` class's jobs
    allowed to wait 0.3 s in the gateway's queue WHEN a document job's summary call comes
    THEN the gateway sheds it (503), the part backs off and tries again, and once the slot
    is free it succeeds: the job is done, its part took more than one attempt."""
    text = b"A short note about claim 4471.\n"
    registration = register(
        world["use_case"], world["llama"], "text", "note.txt", text, sla_class=world["quick"]
    )
    upload(valkey_client, registration, text)
    holder = _hold_llama(world)
    try:
        ran = run_in_process(valkey_client)
    finally:
        holder.join()

    assert ran.outcomes == {registration.pk: FileState.DONE}
    part = FilePart.objects.get(registration=registration)
    assert part.attempts > 1

    def shed() -> bool:  # the gateway's own record of the 503: dropped from its queue
        entries = cast(list[Any], valkey_client.xrange("sy:decisions"))
        return any(fields[b"decision"] == b"shed" for _, fields in entries)

    assert wait_until(shed, timeout=10, interval=0.1)


def test_job_keys_are_in_the_snapshot_and_admitted_at_their_class(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    """The snapshot carries one key per SLA class at its class, and a default one per use
    case at the lowest-ranked class; a call with the ``hourly`` key that has to wait is
    queued by the gateway at ``low``, the class the officer gave ``hourly``."""
    use_case = world["use_case"]
    keys = snapshot_build(version=1)["keys"]
    hourly = keys[job_key_hash(use_case.pk, world["hourly"].pk)]
    default = keys[job_key_hash(use_case.pk, DEFAULT_JOB_KEY_CLASS)]
    assert (hourly["priority_class"], hourly["use_case_id"]) == ("low", use_case.pk)
    assert keys[job_key_hash(use_case.pk, world["quick"].pk)]["priority_class"] == "batch"
    assert default["priority_class"] == "batch"
    assert default["prefix"] == "job:default"

    holder = _hold_llama(world)
    client = GatewayClient(world["gateway"], job_key(use_case.pk, world["hourly"].pk))
    try:
        answer = client.post_json(
            "/v1/chat/completions",
            {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
        )
    finally:
        holder.join()
        client.close()
    assert answer["choices"][0]["message"]["content"]

    def queued_at_low() -> bool:
        entries = cast(list[Any], valkey_client.xrange("sy:decisions"))
        return any(
            fields[b"decision"] == b"queued"
            and fields[b"reason"] == b"low"
            and fields[b"use_case_id"] == str(use_case.pk).encode()
            for _, fields in entries
        )

    assert wait_until(queued_at_low, timeout=10, interval=0.1)


def test_a_part_the_gateway_refuses_as_bad_input_fails_the_file() -> None:
    """A 4xx other than 429 is the input's fault: PartFailed with the gateway's message."""
    import http.server

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = orjson.dumps(
                {"error": {"message": "The model llama does not exist.", "code": "not_found"}}
            )
            self.send_response(404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = GatewayClient(f"http://127.0.0.1:{server.server_port}", "sk-sy-job-x")
        with pytest.raises(PartFailed, match="404 The model llama does not exist"):
            client.post_json("/v1/chat/completions", {"model": "llama"})
    finally:
        server.shutdown()


@pytest.mark.django_db(transaction=True)  # the cancel comes from the part's thread: committed
def test_a_cancelled_job_stops_at_the_next_part_boundary(
    world: dict[str, Any], valkey_client: valkey.Valkey, settings: Any
) -> None:
    """GIVEN a running three-part job, one part at a time WHEN the team cancels it while its
    first part is in the gateway THEN that part finishes, no other part starts, the file is
    cancelled and its promise released."""
    from scheduler.files.dispatch import file_jobs_dispatch
    from scheduler.files.jobs import file_job_run
    from scheduler.files.registration import file_cancel
    from testkit.file_jobs_world import SYSTEM

    settings.FILE_JOB_PART_CONCURRENCY = 1
    audio = make_wav(TONES)
    registration = register(
        world["use_case"],
        world["whisper"],
        "audio",
        "c.wav",
        audio,
        declared_seconds=5,
        sla_class=world["hourly"],
    )
    upload(valkey_client, registration, audio)
    uploads_consume(client=valkey_client)
    handed: list[str] = []
    file_jobs_dispatch(client=valkey_client, send=lambda pk, token: handed.append(token))
    real = GatewayClient(world["gateway"], job_key(world["use_case"].pk, world["hourly"].pk))

    class CancelDuringFirstCall:
        """The real gateway client; the team's cancel lands while the first part is out."""

        def post_json(self, path: str, body: Any) -> dict[str, Any]:
            return real.post_json(path, body)

        def post_multipart(self, *args: Any) -> dict[str, Any]:
            answer = real.post_multipart(*args)
            file_cancel(actor=SYSTEM, file=FileRegistration.objects.get(pk=registration.pk))
            return answer

    outcome = file_job_run(
        registration.pk, handed[0], client=valkey_client, gateway=CancelDuringFirstCall()
    )
    real.close()

    assert outcome == FileState.CANCELLED
    registration.refresh_from_db()
    assert registration.state == FileState.CANCELLED
    states = list(
        FilePart.objects.filter(registration=registration)
        .order_by("index")
        .values_list("state", flat=True)
    )
    assert states == [PartState.DONE, PartState.PENDING, PartState.PENDING]
    assert not valkey_client.hexists(feasibility.ledger_key("whisper"), str(registration.pk))


def test_an_explicit_deadline_runs_on_the_default_job_key_and_skips_missing_embeddings(
    world: dict[str, Any], valkey_client: valkey.Valkey
) -> None:
    """GIVEN a use case with no SLA class and no embedding model WHEN it registers a text file
    with an explicit deadline THEN its job calls the gateway with the use case's default job
    key (admitted: the file is done) and its chunks carry no embedding."""
    text = b"Meeting notes: the renewal of policy 4471 is due in March.\n" * 5
    registration = register(
        world["notes"],
        world["llama"],
        "text",
        "notes.txt",
        text,
        deadline=datetime.now(UTC) + timedelta(hours=1),
    )
    upload(valkey_client, registration, text)

    ran = run_in_process(valkey_client)

    assert ran.outcomes == {registration.pk: FileState.DONE}
    registration.refresh_from_db()
    store = FilesStore()
    rows = [
        orjson.loads(line) for line in store.read(registration.outputs["chunks.jsonl"]).splitlines()
    ]
    assert rows
    assert all(row["embedding"] is None for row in rows)
    summary = orjson.loads(store.read(registration.outputs["summary.json"]))
    assert summary["summary"]
