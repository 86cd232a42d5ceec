"""From an S3 upload to a queued job: the endpoint's event is what the consumer expects.

GIVEN a registration of alice's use case,
WHEN it is uploaded through the endpoint and the uploads consumer runs once,
THEN the registration is queued with what arrived (bytes, SHA-256, the object), and a second
upload is refused by its state as well as by the marker.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest
from botocore.exceptions import ClientError

from governance.choices import FileState
from governance.models import FileRegistration
from scheduler.files.uploads import uploads_consume
from tests.s3endpoint.conftest import World

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_upload_through_the_endpoint_queues_the_registrations_job(
    s3_world: World, valkey_client: Any
) -> None:
    body = os.urandom(100_000)
    registration = s3_world.register("call.wav", declared_bytes=len(body))
    key = f"{registration.pk}/call.wav"
    s3_world.client().put_object(Bucket=s3_world.bucket, Key=key, Body=body)
    report = uploads_consume(client=valkey_client)
    assert report.queued == 1, report
    stored = FileRegistration.objects.get(pk=registration.pk)
    assert stored.state == FileState.QUEUED
    assert stored.source_bytes == len(body)
    assert stored.source_sha256 == hashlib.sha256(body).hexdigest()
    assert stored.source_object.endswith(f"/{registration.pk}/call.wav")
    valkey_client.flushdb()  # no marker left: the state alone must refuse the next upload
    with pytest.raises(ClientError) as refused:
        s3_world.client().put_object(Bucket=s3_world.bucket, Key=key, Body=b"again")
    assert refused.value.response["Error"]["Code"] == "ConditionalRequestConflict"
