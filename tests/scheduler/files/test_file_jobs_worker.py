"""File jobs in real Celery workers: a worker SIGKILLed in the middle of a job loses nothing.

GIVEN a recording of six utterances, a transcription replica slow enough that each part takes
a moment, one part at a time, and a real worker running the job through the real gateway,
WHEN the worker is SIGKILLed after some parts are done,
THEN its lease lapses, the dispatcher hands the job to a second worker, which runs only the
parts not done (a part the dead worker had started included), and the file ends done with
its transcript; the parts done before the kill were not run again; and the use case's
webhook receives ``file.done``, signed.
"""

from __future__ import annotations

import base64
import os
import signal
from typing import Any

import orjson
import pytest
import valkey

from governance.audit import Actor
from governance.choices import FileState
from governance.models import FileRegistration
from governance.snapshot import snapshot_publish
from ops.processes import wait_until
from runtime.valkey_urls import for_kombu
from scheduler.files.dispatch import file_jobs_dispatch
from scheduler.files.objects import FilesStore
from scheduler.files.uploads import uploads_consume
from scheduler.files.webhook_settings import webhook_set
from scheduler.models import FilePart, PartState
from testkit.factories import make_model, make_tenant, make_use_case
from testkit.file_jobs_world import (
    RECEIVER_ENV,
    WebhookReceiver,
    allow_receivers,
    make_wav,
    register,
    seed_priority,
    sla_class,
    upload,
    verify_standard_webhook,
)
from tests.conftest import CeleryWorkerFactory, GatewayFactory, SimulatorFactory
from tests.scheduler.files.conftest import FilesBucket

pytestmark = pytest.mark.django_db(transaction=True)
JOB_KEY_SECRET = "job-keys-of-the-worker-test"
RECORDS_KEYS = f"wt:{base64.b64encode(os.urandom(32)).decode()}"


def test_a_worker_killed_mid_job_loses_nothing_and_the_webhook_is_told(
    settings: Any,
    valkey_url: str,
    valkey_client: valkey.Valkey,
    files_bucket: FilesBucket,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
    start_celery_worker: CeleryWorkerFactory,
) -> None:
    settings.VALKEY_URL = valkey_url
    settings.JOB_KEY_SECRET = JOB_KEY_SECRET
    settings.RECORDS_KEYS = RECORDS_KEYS
    settings.FILE_JOB_LEASE_SECONDS = 2.0
    allow_receivers(settings)  # the webhook's receiver is on loopback: the operator allows it
    classes = seed_priority()
    whisper_sim = start_simulator("whisper", "--kind", "transcription", "--time-scale", "40")
    whisper = make_model("whisper", [whisper_sim.base_url], capabilities=["transcription"])
    use_case = make_use_case(make_tenant("acme"), "transcribe", models=(whisper,))
    hourly = sla_class(use_case, "hourly", classes["batch"])
    snapshot_publish()
    gateway = start_gateway()
    env = {
        **files_bucket.env,
        "SWITCHYARD_FILE_JOBS_GATEWAY_URL": gateway.base_url,
        "SWITCHYARD_JOB_KEY_SECRET": JOB_KEY_SECRET,
        "SWITCHYARD_RECORDS_KEYS": RECORDS_KEYS,
        "SWITCHYARD_FILE_JOB_PART_CONCURRENCY": "1",
        "SWITCHYARD_FILE_JOB_LEASE_SECONDS": "2",
        **RECEIVER_ENV,
    }
    from config.celery import app

    app.conf.update(broker_url=for_kombu(valkey_url), result_backend=for_kombu(valkey_url))
    first = start_celery_worker("files", **env)

    with WebhookReceiver() as receiver:
        secret = webhook_set(actor=Actor.system("tests"), use_case=use_case, url=receiver.url)
        assert secret is not None
        audio = make_wav([1.2] * 6)
        registration = register(
            use_case,
            whisper,
            "audio",
            "long-call.wav",
            audio,
            declared_seconds=12,
            sla_class=hourly,
        )
        upload(valkey_client, registration, audio)
        assert uploads_consume(client=valkey_client).queued == 1
        assert file_jobs_dispatch(client=valkey_client) == [registration.pk]

        def parts_done() -> int:
            return FilePart.objects.filter(registration=registration, state=PartState.DONE).count()

        assert wait_until(lambda: parts_done() >= 2, timeout=60, interval=0.05), first.log_tail()
        first.signal(signal.SIGKILL)
        assert wait_until(lambda: not first.alive(), timeout=10)
        before = {
            part.index: (part.finished_at, part.attempts)
            for part in FilePart.objects.filter(registration=registration, state=PartState.DONE)
        }
        registration.refresh_from_db()
        assert registration.state == FileState.RUNNING
        assert 2 <= len(before) < 6

        second = start_celery_worker("files", **env)

        def finished() -> bool:
            file_jobs_dispatch(client=valkey_client)  # what beat does every couple of seconds
            registration.refresh_from_db()
            return registration.state == FileState.DONE

        assert wait_until(finished, timeout=90, interval=0.5), second.log_tail()
        assert wait_until(lambda: len(receiver.received) == 1, timeout=30), second.log_tail()

    parts = list(FilePart.objects.filter(registration=registration).order_by("index"))
    assert [part.state for part in parts] == [PartState.DONE] * 6
    for index, (finished_at, attempts) in before.items():
        assert (parts[index].finished_at, parts[index].attempts) == (finished_at, attempts)
    transcript = orjson.loads(FilesStore().read(registration.outputs["transcript.json"]))
    assert len(transcript["segments"]) == 6
    assert registration.progress == 1.0
    [(headers, body)] = receiver.received
    assert verify_standard_webhook(secret, headers, body)
    event = orjson.loads(body)
    assert (event["type"], event["data"]["id"]) == ("file.done", registration.pk)
    assert event["data"]["outputs"] == registration.outputs
    assert FileRegistration.objects.get(pk=registration.pk).state == FileState.DONE
