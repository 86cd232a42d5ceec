"""``last_used_at`` is written in batches, not per request, and not lost on shutdown.

GIVEN alice's credential, never used,
WHEN a client makes a few requests and the endpoint process is stopped (SIGTERM),
THEN the credential's ``last_used_at`` is set (flushed by the lifespan shutdown).
"""

from __future__ import annotations

import pytest

from governance.models import S3Credential
from tests.s3endpoint.conftest import World

pytestmark = pytest.mark.django_db(transaction=True)


def test_last_used_at_is_flushed_when_the_endpoint_stops(s3_world: World) -> None:
    credential = S3Credential.objects.get(access_key_id=s3_world.access_key_id)
    assert credential.last_used_at is None
    client = s3_world.client()
    for _ in range(3):
        client.head_bucket(Bucket=s3_world.bucket)
    s3_world.endpoint.process.stop()  # SIGTERM: uvicorn runs the lifespan shutdown
    credential.refresh_from_db()
    assert credential.last_used_at is not None
    assert credential.last_used_at >= credential.created_at
