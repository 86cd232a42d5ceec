"""Where one test's records go: a bucket of its own on the session's SeaweedFS."""

from __future__ import annotations

from typing import Any

from ops.seaweed import SeaweedServer


class RecordsStore:
    """A test's bucket, with the same settings in-process (``override_settings``) and as
    environment for the processes it starts."""

    def __init__(self, server: SeaweedServer, bucket: str) -> None:
        self.server = server
        self.bucket = bucket
        self.env = {
            "SWITCHYARD_OBJECT_STORAGE": "s3",
            "SWITCHYARD_S3_ENDPOINT_URL": server.endpoint_url,
            "SWITCHYARD_S3_ACCESS_KEY_ID": server.access_key,
            "SWITCHYARD_S3_SECRET_ACCESS_KEY": server.secret_key,
            "SWITCHYARD_RECORDS_BUCKET": bucket,
        }

    def client(self) -> Any:
        """A boto3 S3 client on the server (for tests that look behind the storage API)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.server.endpoint_url,
            aws_access_key_id=self.server.access_key,
            aws_secret_access_key=self.server.secret_key,
            region_name="us-east-1",
        )
