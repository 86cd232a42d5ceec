"""A file with an SLA, end to end, every part real: registered with an API key, answered by the
feasibility model, uploaded with boto3 through Switchyard's S3 endpoint, matched by the upload
consumer, transcribed through the gateway (at the SLA class's priority, with its job key) by the
simulator's transcription model, and its original and transcript downloaded by an auditor —
each download audited.

GIVEN acme's ``calls`` use case (whisper on a simulator replica behind a real gateway) with an
``hourly`` SLA class, alice (its developer, with an API key) and audrey (an auditor),
WHEN alice registers a call recording, issues herself an S3 credential, uploads the WAV with
boto3's managed transfer, and the file-job machinery runs (the upload consumer, the dispatcher
and the runner, in this process: the code a Celery worker runs),
THEN the file is done with a transcript whose segments cover the audio, the gateway admitted
every request with the class's job key, and audrey gets back the very bytes alice uploaded
and the transcript, each download leaving a ``file.download`` event in the audit trail.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from pathlib import Path
from typing import Any

import boto3
import orjson
import pytest
from botocore.config import Config
from rest_framework.test import APIClient

from governance.choices import FileState
from governance.models import AuditEvent, FileRegistration, PriorityClass, SlaClass
from governance.roles import Role
from governance.snapshot import snapshot_publish
from testkit.factories import make_key, make_model, make_tenant, make_use_case, make_user
from testkit.file_jobs_world import make_wav, run_in_process
from tests.conftest import GatewayFactory, SimulatorFactory
from tests.s3endpoint.conftest import Endpoint

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world(
    settings: Any,
    valkey_url: str,
    valkey_client: Any,
    s3_endpoint: Endpoint,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
) -> dict[str, Any]:
    from tests.s3endpoint.conftest import PRESIGN_SECRET, RECORDS_KEYS

    seaweed = s3_endpoint.seaweed
    settings.VALKEY_URL = valkey_url
    settings.RECORDS_KEYS = RECORDS_KEYS
    settings.S3_PRESIGN_SECRET = PRESIGN_SECRET
    settings.FILES_BUCKET = s3_endpoint.files_bucket
    settings.S3_ENDPOINT_PUBLIC_URL = s3_endpoint.url
    # This process reads what the endpoint wrote, and writes the outputs beside it.
    settings.STORAGES = {**settings.STORAGES, "files": seaweed.storage(s3_endpoint.files_bucket)}
    whisper_sim = start_simulator("whisper", "--kind", "transcription", "--time-scale", "0")
    whisper = make_model("whisper", [whisper_sim.base_url], capabilities=["transcription"])
    acme = make_tenant("acme")
    calls = make_use_case(acme, f"calls-{uuid.uuid4().hex[:6]}", models=(whisper,))
    batch = PriorityClass.objects.get_or_create(
        name="batch", defaults={"rank": 4, "vllm_priority": 4, "max_pool_share": 0.5}
    )[0]
    SlaClass.objects.create(
        use_case=calls,
        name="hourly",
        turnaround_seconds=3600,
        priority_class=batch,
        kinds=["audio"],
        max_file_bytes=64 * 1024 * 1024,
    )
    alice = make_user("alice", Role.DEVELOPER, tenants=(acme,))
    audrey = make_user("audrey", Role.AUDITOR)
    _, key = make_key(calls)
    snapshot_publish()
    gateway = start_gateway()
    settings.FILE_JOBS_GATEWAY_URL = gateway.base_url
    return {
        "calls": calls,
        "alice": alice,
        "audrey": audrey,
        "key": key,
        "gateway": gateway,
        "endpoint": s3_endpoint,
        "valkey": valkey_client,
    }


def test_a_call_recording_is_registered_uploaded_transcribed_and_audited(
    world: dict[str, Any], tmp_path: Path
) -> None:
    recording = make_wav([2.0, 1.5, 2.5])
    path = tmp_path / "call-0001.wav"
    path.write_bytes(recording)

    # 1. Registered with the use case's API key: the feasibility answer comes at once.
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world['key']}")
    answer = client.post(
        "/api/files/",
        {
            "use_case": world["calls"].pk,
            "kind": "audio",
            "filename": "call-0001.wav",
            "model": "whisper",
            "declared_bytes": len(recording),
            "declared_seconds": 8.4,
            "sla_class": "hourly",
        },
        format="json",
    )
    assert answer.status_code == 201, answer.content
    registered = answer.json()
    upload = registered["upload"]
    assert registered["state"] == "registered"
    assert registered["promised_by"]
    assert upload["endpoint_url"] == world["endpoint"].url

    # 2. alice issues an S3 credential for the use case: its secret is shown this once.
    portal = APIClient()
    portal.force_authenticate(world["alice"])
    issued = portal.post(
        f"/api/use-cases/{world['calls'].pk}/s3-credentials/", {"name": "uploader"}, format="json"
    )
    assert issued.status_code == 201, issued.content
    credential = issued.json()

    # 3. boto3's managed upload through the S3 endpoint (its installed defaults).
    s3 = boto3.client(
        "s3",
        endpoint_url=upload["endpoint_url"],
        aws_access_key_id=credential["credential"]["access_key_id"],
        aws_secret_access_key=credential["secret_access_key"],
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    s3.upload_file(str(path), upload["bucket"], upload["key"])

    # 4. The upload consumer, the dispatcher and the runner.
    for _ in range(6):
        run_in_process(world["valkey"])
        file = FileRegistration.objects.get(pk=registered["id"])
        if file.state in (FileState.DONE, FileState.FAILED):
            break
    assert file.state == FileState.DONE, file.failure
    assert file.progress == 1.0
    assert file.source_sha256 == hashlib.sha256(recording).hexdigest()
    assert file.uploaded_at is not None
    assert file.promised_by > file.uploaded_at  # the turnaround counts from the upload
    assert {"transcript.txt", "transcript.json", "transcript.vtt"} <= set(file.outputs)
    assert file.counts["audio_seconds"] == math.ceil(len_seconds(recording))  # 8.4 s, rounded up

    # Every call the job made went through the gateway as the use case, with the job key
    # (which has no key id): one answered transcription per part.
    usage = [fields for _, fields in world["valkey"].xrange("sy:usage")]
    job_calls = [
        fields
        for fields in usage
        if fields[b"use_case_id"] == str(world["calls"].pk).encode() and fields[b"key_id"] == b""
    ]
    assert len(job_calls) == file.parts.count() >= 2
    assert {(f[b"model"], f[b"status"], f[b"endpoint"]) for f in job_calls} == {
        (b"whisper", b"200", b"/v1/audio/transcriptions")
    }

    # 5. audrey, an auditor, reads the file, listens to the original and downloads the
    #    transcript; both downloads are in the audit trail.
    auditor = APIClient()
    auditor.force_authenticate(world["audrey"])
    detail = auditor.get(f"/api/files/{file.pk}/").json()
    assert detail["state"] == "done"
    original = auditor.get(f"/api/files/{file.pk}/original/")
    assert original.status_code == 200
    assert streamed(original) == recording
    transcript = auditor.get(f"/api/files/{file.pk}/outputs/transcript.json/")
    assert transcript.status_code == 200
    segments = orjson.loads(streamed(transcript))["segments"]
    assert segments
    assert segments[-1]["end"] <= len_seconds(recording) + 0.01
    downloads = AuditEvent.objects.filter(action="file.download", actor="audrey")
    assert downloads.count() == 2


def len_seconds(wav: bytes) -> float:
    """The duration of a WAV made by make_wav (16-bit stereo at 44.1 kHz, a 44-byte header)."""
    return (len(wav) - 44) / (2 * 2 * 44_100)


def streamed(response: Any) -> bytes:
    """A streaming download's bytes (the test client's response types it loosely)."""
    return b"".join(response.streaming_content)
