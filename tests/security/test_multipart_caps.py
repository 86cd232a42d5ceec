"""A multipart upload cannot grow past its registration's size cap, however its parts race,
and one left unfinished is aborted once it is old enough (issue 24, defect 11).

GIVEN a real S3 endpoint process in front of SeaweedFS (tests/s3endpoint's fixtures) and
alice's S3 credential for acme's ``transcribe`` use case,
WHEN parts of one upload arrive at once whose sizes add up to more than the registration
takes, THEN each part reserves its bytes atomically before any is stored: the parts past the
cap are refused with ``EntityTooLarge`` and the completed object is within the cap;
WHEN an upload is started and abandoned, THEN the periodic task (run by a real Celery worker)
aborts it in the backing store once it is older than ``SWITCHYARD_S3_MULTIPART_MAX_AGE_SECONDS``
and frees the registration for a new upload, and leaves a younger one alone.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import valkey
from botocore.exceptions import ClientError

from config.celery import app
from ops.processes import wait_until
from runtime.valkey_urls import for_kombu
from s3endpoint.registrations import size_limit
from scheduler.files.upload_expiry import multipart_uploads_expire
from scheduler.schedules import BEAT_SCHEDULE
from testkit.database import database_url
from tests.conftest import CeleryWorkerFactory
from tests.s3endpoint import conftest as s3endpoint_conftest
from tests.s3endpoint.conftest import World
from tests.s3endpoint.test_uploads import events

pytestmark = pytest.mark.django_db(transaction=True)

# The S3 endpoint world of tests/s3endpoint/, reused as it is.
s3_endpoint = s3endpoint_conftest.s3_endpoint
s3_world = s3endpoint_conftest.s3_world

MIB = 1024 * 1024
PART = 5 * MIB  # S3's smallest part but the last


def _pending_uploads(world: World, key: str) -> list[str]:
    """The upload ids the backing store still holds for ``key``."""
    listed = world.endpoint.store().list_multipart_uploads(
        Bucket=world.endpoint.files_bucket, Prefix=key
    )
    return [upload["UploadId"] for upload in listed.get("Uploads", [])]


def _object_name(world: World, registration_id: int, filename: str) -> str:
    return f"uploads/acme/{world.use_case.slug}/{registration_id}/{filename}"


def test_parts_racing_past_the_cap_are_refused_and_the_object_stays_within_it(
    s3_world: World, valkey_client: valkey.Valkey
) -> None:
    """GIVEN a registration of 12 MiB (its cap a little more) WHEN six 5 MiB parts of one
    upload are sent at the same moment from six threads THEN at most two are accepted, the
    others are refused with EntityTooLarge, and completing with the accepted parts stores an
    object within the cap."""
    registration = s3_world.register("board-meeting.wav", declared_bytes=12 * MIB)
    key = f"{registration.pk}/board-meeting.wav"
    client = s3_world.client()
    upload_id = client.create_multipart_upload(Bucket=s3_world.bucket, Key=key)["UploadId"]
    bodies = {number: os.urandom(PART) for number in range(1, 7)}
    start = threading.Barrier(len(bodies))
    accepted: dict[int, str] = {}
    refused: dict[int, str] = {}

    def send(number: int) -> None:
        own = s3_world.client()  # one client per thread, as boto3's transfer manager does
        start.wait()
        try:
            answer = own.upload_part(
                Bucket=s3_world.bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=bodies[number],
            )
        except ClientError as exc:
            refused[number] = str(exc.response["Error"]["Code"])
        else:
            accepted[number] = answer["ETag"]

    threads = [threading.Thread(target=send, args=(number,)) for number in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    cap = size_limit(12 * MIB, s3_world.sla.max_file_bytes)
    assert len(accepted) + len(refused) == 6
    assert len(accepted) == cap // PART == 2, (accepted, refused)
    assert set(refused.values()) == {"EntityTooLarge"}
    client.complete_multipart_upload(
        Bucket=s3_world.bucket,
        Key=key,
        UploadId=upload_id,
        MultipartUpload={
            "Parts": [{"PartNumber": n, "ETag": accepted[n]} for n in sorted(accepted)]
        },
    )
    stored = s3_world.stored(registration)
    assert stored == b"".join(bodies[n] for n in sorted(accepted))
    assert len(stored) <= cap
    [event] = events(valkey_client)
    assert event.size == len(stored)


def test_an_abandoned_multipart_upload_is_aborted_once_old_and_frees_its_registration(
    s3_world: World,
    settings: Any,
    valkey_url: str,
    start_celery_worker: CeleryWorkerFactory,
) -> None:
    """GIVEN an upload started with one part sent and never completed WHEN the expiry runs
    with a maximum age it is younger than THEN it is kept; WHEN a real worker runs the
    periodic task with a maximum age of zero THEN the store no longer holds it, the endpoint
    no longer knows it, and the registration takes a new upload."""
    assert BEAT_SCHEDULE["expire-multipart-uploads"]["task"] == (
        "scheduler.expire_multipart_uploads"
    )
    registration = s3_world.register("abandoned.wav", declared_bytes=6 * MIB)
    key = f"{registration.pk}/abandoned.wav"
    client = s3_world.client()
    upload_id = client.create_multipart_upload(Bucket=s3_world.bucket, Key=key)["UploadId"]
    client.upload_part(
        Bucket=s3_world.bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=os.urandom(PART)
    )
    stored_key = _object_name(s3_world, registration.pk, "abandoned.wav")
    assert _pending_uploads(s3_world, stored_key) == [upload_id]
    with pytest.raises(ClientError):  # the registration is taken by the unfinished upload
        client.put_object(Bucket=s3_world.bucket, Key=key, Body=b"x" * 1000)

    endpoint = s3_world.endpoint
    settings.STORAGES = {
        **settings.STORAGES,
        "files": endpoint.seaweed.storage(endpoint.files_bucket),
    }
    settings.S3_MULTIPART_MAX_AGE_SECONDS = 3600.0
    young = multipart_uploads_expire()
    assert young.aborted == 0
    assert _pending_uploads(s3_world, stored_key) == [upload_id]

    env = dict(endpoint.process.env)
    env.update(
        SWITCHYARD_OBJECT_STORAGE="s3",
        SWITCHYARD_DATABASE_URL=database_url(),
        SWITCHYARD_S3_MULTIPART_MAX_AGE_SECONDS="0",
    )
    app.conf.update(broker_url=for_kombu(valkey_url), result_backend=for_kombu(valkey_url))
    worker = start_celery_worker("uploads", **env)
    app.send_task("scheduler.expire_multipart_uploads")

    assert wait_until(
        lambda: _pending_uploads(s3_world, stored_key) == [], timeout=60, interval=0.2
    ), worker.log_tail()
    with pytest.raises(ClientError) as gone:
        client.list_parts(Bucket=s3_world.bucket, Key=key, UploadId=upload_id)
    assert gone.value.response["Error"]["Code"] == "NoSuchUpload"
    fresh = os.urandom(4000)
    client.put_object(Bucket=s3_world.bucket, Key=key, Body=fresh)
    assert s3_world.stored(registration) == fresh
