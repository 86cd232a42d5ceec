"""Fixtures for the file jobs' tests: a files bucket on the session's SeaweedFS."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest


class FilesBucket:
    """One test's files bucket on the session's SeaweedFS: the settings in-process, and the
    environment for the processes it starts."""

    def __init__(self, endpoint: str, access_key: str, secret_key: str, bucket: str) -> None:
        self.bucket = bucket
        self.env = {
            "SWITCHYARD_OBJECT_STORAGE": "s3",
            "SWITCHYARD_S3_ENDPOINT_URL": endpoint,
            "SWITCHYARD_S3_ACCESS_KEY_ID": access_key,
            "SWITCHYARD_S3_SECRET_ACCESS_KEY": secret_key,
            "SWITCHYARD_FILES_BUCKET": bucket,
        }


@pytest.fixture
def files_bucket(seaweed: Any) -> Iterator[FilesBucket]:
    """``storages["files"]`` on a fresh bucket of the session's SeaweedFS."""
    import boto3
    from django.conf import settings
    from django.test import override_settings

    bucket = f"files-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=seaweed.endpoint_url,
        aws_access_key_id=seaweed.access_key,
        aws_secret_access_key=seaweed.secret_key,
        region_name="us-east-1",
    ).create_bucket(Bucket=bucket)
    storages = {**settings.STORAGES, "files": seaweed.storage(bucket)}
    with override_settings(STORAGES=storages, FILES_BUCKET=bucket):
        yield FilesBucket(seaweed.endpoint_url, seaweed.access_key, seaweed.secret_key, bucket)
