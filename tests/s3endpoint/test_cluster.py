"""The S3 endpoint on a Valkey Cluster of three primaries (docs/valkey-ha.md).

GIVEN an endpoint process whose SWITCHYARD_VALKEY_URL is a three-primary Cluster
WHEN files are uploaded with boto3 (a PutObject, a multipart upload) and a second upload
races the first
THEN every finished upload marks its registration done and announces itself on
``sy:uploads`` in one MULTI (its keys share the stream's slot), and the second upload is
still refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from valkey.cluster import ValkeyCluster
from valkey.crc import key_slot

from ops.seaweed import SeaweedServer
from runtime.valkey_urls import sync_client
from s3endpoint.markers import DONE, marker_key, parts_key
from scheduler.files.upload_events import UPLOADS_STREAM, UploadEvent
from testkit.database import database_url
from testkit.valkey_ha import ClusterSet
from tests.s3endpoint.conftest import Endpoint, World, running_endpoint

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    nodes = ClusterSet(Path(tmp_path_factory.mktemp("s3-cluster")))
    try:
        yield nodes.start()
    finally:
        nodes.stop()


@pytest.fixture(scope="module")
def valkey_url(cluster: ClusterSet) -> str:
    """This module's Valkey is the Cluster (overrides the session's one server)."""
    return cluster.url


@pytest.fixture
def valkey_client(cluster: ClusterSet) -> Iterator[Any]:
    client = sync_client(cluster.url)
    assert isinstance(client, ValkeyCluster)
    client.flushall(target_nodes=ValkeyCluster.PRIMARIES)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def s3_endpoint(
    seaweed: SeaweedServer,
    valkey_url: str,
    valkey_server: Any,
    django_db_setup: Any,
    django_db_blocker: Any,
) -> Iterator[Endpoint]:
    # A Cluster can be neither Celery's broker nor the Channels layer: the settings refuse
    # to load without URLs of their own (the session's one server here).
    one_server = f"valkey://127.0.0.1:{valkey_server.port}/0"
    with django_db_blocker.unblock():
        db = database_url()
    with running_endpoint(
        seaweed,
        valkey_url,
        db,
        SWITCHYARD_CELERY_BROKER_URL=one_server,
        SWITCHYARD_CHANNELS_VALKEY_URL=one_server,
    ) as endpoint:
        yield endpoint


def events(client: ValkeyCluster) -> list[UploadEvent]:
    return [UploadEvent.parse(fields) for _, fields in client.xrange(UPLOADS_STREAM)]


def test_the_markers_share_the_upload_streams_slot() -> None:
    slot = key_slot(UPLOADS_STREAM.encode())
    assert key_slot(marker_key(7).encode()) == key_slot(parts_key(7).encode()) == slot


def test_a_put_object_finishes_on_the_cluster_and_a_second_upload_is_refused(
    s3_world: World, valkey_client: ValkeyCluster
) -> None:
    body = os.urandom(50_000)
    registration = s3_world.register("call.wav", declared_bytes=len(body))
    s3_world.client().put_object(
        Bucket=s3_world.bucket, Key=f"{registration.pk}/call.wav", Body=body
    )
    assert s3_world.stored(registration) == body
    [event] = events(valkey_client)
    assert (event.registration_id, event.size) == (registration.pk, len(body))
    assert valkey_client.get(marker_key(registration.pk)) == DONE.encode()

    with pytest.raises(ClientError):
        s3_world.client().put_object(
            Bucket=s3_world.bucket, Key=f"{registration.pk}/call.wav", Body=body
        )
    assert len(events(valkey_client)) == 1


def test_a_multipart_upload_finishes_on_the_cluster(
    s3_world: World, valkey_client: ValkeyCluster, tmp_path: Path
) -> None:
    from boto3.s3.transfer import TransferConfig

    body = os.urandom(6 * 1024 * 1024)  # two parts: 5 MiB and 1 MiB
    source = tmp_path / "meeting.wav"
    source.write_bytes(body)
    registration = s3_world.register("meeting.wav", declared_bytes=len(body))
    s3_world.client().upload_file(
        str(source),
        s3_world.bucket,
        f"{registration.pk}/meeting.wav",
        Config=TransferConfig(
            multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024
        ),
    )
    assert s3_world.stored(registration) == body
    [event] = events(valkey_client)
    assert (event.registration_id, event.size) == (registration.pk, len(body))
    assert event.etag.endswith("-2")
    assert valkey_client.get(marker_key(registration.pk)) == DONE.encode()
    assert not valkey_client.exists(parts_key(registration.pk))
