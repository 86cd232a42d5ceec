"""boto3's defaults over TLS: aws-chunked bodies with a CRC32 trailer, single and multipart.

GIVEN the endpoint served over TLS (as in production) and boto3 as installed,
WHEN a file is put and another uploaded in parts,
THEN the endpoint decodes STREAMING-UNSIGNED-PAYLOAD-TRAILER bodies, checks their checksum
trailers, and the stored bytes are the uploaded ones.
"""

from __future__ import annotations

import os
from typing import Any

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from tests.s3endpoint.conftest import TlsEndpoint, World

pytestmark = pytest.mark.django_db(transaction=True)


def tls_client(world: World, endpoint: TlsEndpoint) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint.url,
        aws_access_key_id=world.access_key_id,
        aws_secret_access_key=world.secret,
        region_name="us-east-1",
        verify=endpoint.ca_bundle,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def test_boto3_defaults_over_tls_send_checksum_trailers_that_the_endpoint_checks(
    s3_world: World, s3_endpoint_tls: TlsEndpoint, tmp_path: Any
) -> None:
    client = tls_client(s3_world, s3_endpoint_tls)
    small = os.urandom(70_000)
    single = s3_world.register("single.wav", declared_bytes=len(small))
    client.put_object(Bucket=s3_world.bucket, Key=f"{single.pk}/single.wav", Body=small)
    assert s3_world.stored(single) == small

    large = os.urandom(10 * 1024 * 1024 + 17)
    source = tmp_path / "parts.wav"
    source.write_bytes(large)
    parts = s3_world.register("parts.wav", declared_bytes=len(large))
    client.upload_file(
        str(source),
        s3_world.bucket,
        f"{parts.pk}/parts.wav",
        Config=TransferConfig(
            multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024
        ),
    )
    assert s3_world.stored(parts) == large
    log = s3_endpoint_tls.process.log_text()
    trailer_mode = "mode=STREAMING-UNSIGNED-PAYLOAD-TRAILER trailer=x-amz-checksum-crc32"
    assert f"key={single.pk}/single.wav bytes=70000 {trailer_mode}" in log
    assert log.count(f"key={parts.pk}/parts.wav") == 3


def test_aws_s3_cp_uploads_a_registered_file_in_parts(
    s3_world: World, s3_endpoint_tls: TlsEndpoint, tmp_path: Any
) -> None:
    """`aws s3 cp` as a person would type it: TLS, the CLI's defaults (8 MiB parts)."""
    import subprocess
    import sys
    from pathlib import Path

    body = os.urandom(9 * 1024 * 1024)
    source = tmp_path / "board-meeting.wav"
    source.write_bytes(body)
    registration = s3_world.register("board-meeting.wav", declared_bytes=len(body))
    aws = Path(sys.executable).parent / "aws"
    done = subprocess.run(
        [
            str(aws),
            "s3",
            "cp",
            str(source),
            f"s3://{s3_world.bucket}/{registration.pk}/board-meeting.wav",
            "--endpoint-url",
            s3_endpoint_tls.url,
            "--ca-bundle",
            s3_endpoint_tls.ca_bundle,
        ],
        env={
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(tmp_path),
            "AWS_ACCESS_KEY_ID": s3_world.access_key_id,
            "AWS_SECRET_ACCESS_KEY": s3_world.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert s3_world.stored(registration) == body
    assert s3_endpoint_tls.process.log_text().count(f"key={registration.pk}/board-meeting.wav") == 2
