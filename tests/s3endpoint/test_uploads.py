"""Uploads through the S3 endpoint with unmodified boto3, onto the real files bucket.

GIVEN a real endpoint process in front of SeaweedFS, alice's S3 credential for acme's
``transcribe`` use case and its registrations,
WHEN files are uploaded (single PUT, multipart, presigned) or refused,
THEN the bytes in SeaweedFS are exactly the upload's, one event per upload is on
``sy:uploads``, and refused uploads store nothing.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest
from botocore.exceptions import ClientError

from scheduler.upload_events import UPLOADS_STREAM, UploadEvent
from tests.s3endpoint.conftest import World

pytestmark = pytest.mark.django_db(transaction=True)


def error_code(excinfo: pytest.ExceptionInfo[ClientError]) -> str:
    return str(excinfo.value.response["Error"]["Code"])


def events(valkey_client: Any) -> list[UploadEvent]:
    return [UploadEvent.parse(fields) for _, fields in valkey_client.xrange(UPLOADS_STREAM)]


def test_put_object_stores_the_bytes_and_announces_the_upload(
    s3_world: World, valkey_client: Any
) -> None:
    body = os.urandom(200_000)
    registration = s3_world.register("call.wav", declared_bytes=len(body))
    answer = s3_world.client().put_object(
        Bucket=s3_world.bucket, Key=f"{registration.pk}/call.wav", Body=body
    )
    assert answer["ETag"].strip('"') == hashlib.md5(body).hexdigest()  # noqa: S324 - S3's ETag
    assert s3_world.stored(registration) == body
    [event] = events(valkey_client)
    assert event.registration_id == registration.pk
    assert event.object_name == f"uploads/acme/transcribe/{registration.pk}/call.wav"
    assert event.size == len(body)
    assert event.sha256 == hashlib.sha256(body).hexdigest()
    assert event.uploader == f"s3:{s3_world.access_key_id}"
