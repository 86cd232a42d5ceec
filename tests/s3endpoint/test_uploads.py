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

from scheduler.files.upload_events import UPLOADS_STREAM, UploadEvent
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
    assert event.object_name == f"uploads/acme/{s3_world.use_case.slug}/{registration.pk}/call.wav"
    assert event.size == len(body)
    assert event.sha256 == hashlib.sha256(body).hexdigest()
    assert event.uploader == f"s3:{s3_world.access_key_id}"


def test_a_forged_signature_is_refused_and_nothing_is_stored(s3_world: World) -> None:
    registration = s3_world.register()
    forger = s3_world.client(
        secret=s3_world.secret[:-1] + ("A" if s3_world.secret[-1] != "A" else "B")
    )
    with pytest.raises(ClientError) as refused:
        forger.put_object(Bucket=s3_world.bucket, Key=f"{registration.pk}/call.wav", Body=b"x")
    assert error_code(refused) == "SignatureDoesNotMatch"
    assert s3_world.stored(registration) is None


def test_an_unknown_access_key_is_refused(s3_world: World) -> None:
    registration = s3_world.register()
    stranger = s3_world.client(access_key_id="SYAKAAAAAAAAAAAAAAAA")
    with pytest.raises(ClientError) as refused:
        stranger.put_object(Bucket=s3_world.bucket, Key=f"{registration.pk}/call.wav", Body=b"x")
    assert error_code(refused) == "InvalidAccessKeyId"


def test_a_revoked_credential_is_refused(s3_world: World) -> None:
    from governance.audit import Actor
    from governance.models import S3Credential
    from scheduler.files.s3_credentials import s3_credential_revoke

    registration = s3_world.register()
    credential = S3Credential.objects.get(access_key_id=s3_world.access_key_id)
    s3_credential_revoke(actor=Actor.system("tests"), credential=credential, reason="leaked")
    with pytest.raises(ClientError) as refused:
        s3_world.client().put_object(
            Bucket=s3_world.bucket, Key=f"{registration.pk}/call.wav", Body=b"x"
        )
    assert error_code(refused) == "InvalidAccessKeyId"
    assert s3_world.stored(registration) is None


def test_a_credential_revoked_after_use_stops_working_once_the_cache_lets_go(
    s3_world: World,
) -> None:
    from governance.audit import Actor
    from governance.models import S3Credential
    from ops.processes import wait_until
    from scheduler.files.s3_credentials import s3_credential_revoke

    client = s3_world.client()
    client.head_bucket(Bucket=s3_world.bucket)  # looked up and cached
    credential = S3Credential.objects.get(access_key_id=s3_world.access_key_id)
    s3_credential_revoke(actor=Actor.system("tests"), credential=credential)

    def refused() -> bool:
        try:
            client.head_bucket(Bucket=s3_world.bucket)
        except ClientError as exc:
            return exc.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        return False

    assert wait_until(refused, timeout=20, interval=0.2)


def test_multipart_upload_file_stores_every_part_in_order(
    s3_world: World, valkey_client: Any, tmp_path: Any
) -> None:
    from boto3.s3.transfer import TransferConfig

    body = os.urandom(11 * 1024 * 1024)  # three parts of 5 MiB (the last one 1 MiB)
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
    assert (event.registration_id, event.size, event.sha256) == (registration.pk, len(body), "")
    assert event.etag.endswith("-3")  # S3's multipart ETag: three parts


def test_presigned_put_from_the_registration_answer_uploads_with_plain_requests(
    s3_world: World, valkey_client: Any
) -> None:
    import requests

    from scheduler.files.s3_credentials import presigned_put_url

    body = b"RIFF" + os.urandom(5000)
    registration = s3_world.register("call.wav", declared_bytes=len(body))
    url = presigned_put_url(registration)
    answer = requests.put(url, data=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert s3_world.stored(registration) == body
    [event] = events(valkey_client)
    assert event.sha256 == hashlib.sha256(body).hexdigest()
    assert event.uploader.startswith("s3:SYPU")


def test_a_presigned_url_is_bound_to_its_key(s3_world: World) -> None:
    import requests

    from scheduler.files.s3_credentials import presigned_put_url

    first, second = s3_world.register("a.wav"), s3_world.register("b.wav")
    url = presigned_put_url(first).replace(f"/{first.pk}/a.wav", f"/{second.pk}/b.wav")
    answer = requests.put(url, data=b"x", timeout=30)
    assert answer.status_code == 403
    assert "<Code>SignatureDoesNotMatch</Code>" in answer.text
    assert s3_world.stored(second) is None


def test_an_upload_with_no_matching_registration_is_refused_and_nothing_is_written(
    s3_world: World,
) -> None:
    registration = s3_world.register("call.wav")
    elsewhere = s3_world.register("theirs.wav", use_case=s3_world.other)
    client = s3_world.client()
    for key in (f"{registration.pk}/other-name.wav", f"{elsewhere.pk}/theirs.wav", "notes.txt"):
        with pytest.raises(ClientError) as refused:
            client.put_object(Bucket=s3_world.bucket, Key=key, Body=b"x")
        assert error_code(refused) == "AccessDenied"
    with pytest.raises(ClientError) as refused:
        client.put_object(
            Bucket=f"globex-{s3_world.other.slug}", Key=f"{elsewhere.pk}/theirs.wav", Body=b"x"
        )
    assert error_code(refused) == "AccessDenied"
    with pytest.raises(ClientError) as refused:
        client.put_object(Bucket="nobody-here", Key=f"{registration.pk}/call.wav", Body=b"x")
    assert error_code(refused) == "NoSuchBucket"
    for tenant, use_case in (("acme", s3_world.use_case), ("globex", s3_world.other)):
        listed = s3_world.endpoint.store().list_objects_v2(
            Bucket=s3_world.endpoint.files_bucket, Prefix=f"uploads/{tenant}/{use_case.slug}/"
        )
        assert listed.get("KeyCount", 0) == 0


def test_an_upload_larger_than_declared_is_refused(s3_world: World) -> None:
    registration = s3_world.register("call.wav", declared_bytes=1000)
    with pytest.raises(ClientError) as refused:
        s3_world.client().put_object(
            Bucket=s3_world.bucket, Key=f"{registration.pk}/call.wav", Body=b"x" * 200_000
        )
    assert error_code(refused) == "EntityTooLarge"
    assert s3_world.stored(registration) is None


def test_a_second_upload_to_the_same_registration_is_refused(
    s3_world: World, valkey_client: Any
) -> None:
    registration = s3_world.register("call.wav")
    client = s3_world.client()
    key = f"{registration.pk}/call.wav"
    client.put_object(Bucket=s3_world.bucket, Key=key, Body=b"first")
    with pytest.raises(ClientError) as refused:
        client.put_object(Bucket=s3_world.bucket, Key=key, Body=b"second")
    assert error_code(refused) == "ConditionalRequestConflict"
    assert s3_world.stored(registration) == b"first"
    assert len(events(valkey_client)) == 1


def test_an_uploaded_registration_no_longer_takes_uploads(s3_world: World) -> None:
    from governance.choices import FileState
    from governance.models import FileRegistration

    registration = s3_world.register("call.wav")
    FileRegistration.objects.filter(pk=registration.pk).update(state=FileState.CANCELLED)
    with pytest.raises(ClientError) as refused:
        s3_world.client().put_object(
            Bucket=s3_world.bucket, Key=f"{registration.pk}/call.wav", Body=b"x"
        )
    assert error_code(refused) == "ConditionalRequestConflict"


def test_probes_and_listing_show_the_use_cases_own_uploads(s3_world: World) -> None:
    client = s3_world.client()
    registration = s3_world.register("call.wav")
    client.put_object(Bucket=s3_world.bucket, Key=f"{registration.pk}/call.wav", Body=b"hello")
    assert client.head_bucket(Bucket=s3_world.bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert client.get_bucket_location(Bucket=s3_world.bucket)["LocationConstraint"] is None
    head = client.head_object(Bucket=s3_world.bucket, Key=f"{registration.pk}/call.wav")
    assert head["ContentLength"] == 5
    listed = client.list_objects_v2(Bucket=s3_world.bucket)
    assert [item["Key"] for item in listed["Contents"]] == [f"{registration.pk}/call.wav"]
    assert [b["Name"] for b in client.list_buckets()["Buckets"]] == [s3_world.bucket]


def test_a_tampered_body_is_refused_and_nothing_is_stored(s3_world: World) -> None:
    """The signed x-amz-content-sha256 is checked against the bytes that arrive."""
    import requests
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    registration = s3_world.register("call.wav")
    url = f"{s3_world.endpoint.url}/{s3_world.bucket}/{registration.pk}/call.wav"
    signed = AWSRequest(method="PUT", url=url, data=b"the real body")
    S3SigV4Auth(Credentials(s3_world.access_key_id, s3_world.secret), "s3", "us-east-1").add_auth(
        signed
    )
    answer = requests.put(url, data=b"the fake body", headers=dict(signed.headers), timeout=30)
    assert answer.status_code == 400
    assert "<Code>XAmzContentSHA256Mismatch</Code>" in answer.text
    assert s3_world.stored(registration) is None


def test_cors_preflight_answers_the_portals_origin_only(s3_world: World) -> None:
    import requests

    url = f"{s3_world.endpoint.url}/{s3_world.bucket}/1/call.wav"
    headers = {
        "Access-Control-Request-Method": "PUT",
        "Access-Control-Request-Headers": "content-type",
    }
    allowed = requests.options(url, headers={**headers, "Origin": "http://portal.test"}, timeout=10)
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "http://portal.test"
    assert "PUT" in allowed.headers["access-control-allow-methods"]
    other = requests.options(url, headers={**headers, "Origin": "http://evil.test"}, timeout=10)
    assert other.status_code == 403
    assert "access-control-allow-origin" not in other.headers


def chunk_signed_put(world: World, key: str, body: bytes, *, spoil_chunk: int = -1) -> Any:
    """A PUT with a STREAMING-AWS4-HMAC-SHA256-PAYLOAD body, as the Java and Go SDKs send it:
    the seed signature from botocore's signer, each chunk's signature computed here from AWS's
    description (an independent reference for the endpoint's chain)."""
    import hmac

    import requests
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    class StreamingSigner(S3SigV4Auth):  # type: ignore[misc]
        def payload(self, request: Any) -> str:
            return "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"

    size = 64 * 1024
    chunks = [body[i : i + size] for i in range(0, len(body), size)] + [b""]
    encoded_length = sum(len(f"{len(c):x};chunk-signature=") + 64 + 2 + len(c) + 2 for c in chunks)
    url = f"{world.endpoint.url}/{world.bucket}/{key}"
    request = AWSRequest(
        method="PUT",
        url=url,
        headers={
            "Content-Encoding": "aws-chunked",
            "x-amz-decoded-content-length": str(len(body)),
            "Content-Length": str(encoded_length),
        },
    )
    StreamingSigner(Credentials(world.access_key_id, world.secret), "s3", "us-east-1").add_auth(
        request
    )
    timestamp = request.context["timestamp"]
    previous = str(request.headers["Authorization"]).rsplit("Signature=", 1)[1]
    key_material = f"AWS4{world.secret}".encode()
    for part in (timestamp[:8], "us-east-1", "s3", "aws4_request"):
        key_material = hmac.new(key_material, part.encode(), hashlib.sha256).digest()
    scope = f"{timestamp[:8]}/us-east-1/s3/aws4_request"
    encoded = bytearray()
    for number, chunk in enumerate(chunks):
        string_to_sign = "\n".join(
            (
                "AWS4-HMAC-SHA256-PAYLOAD",
                timestamp,
                scope,
                previous,
                hashlib.sha256(b"").hexdigest(),
                hashlib.sha256(chunk).hexdigest(),
            )
        )
        previous = hmac.new(key_material, string_to_sign.encode(), hashlib.sha256).hexdigest()
        signature = previous if number != spoil_chunk else "0" * 64
        encoded += f"{len(chunk):x};chunk-signature={signature}\r\n".encode() + chunk + b"\r\n"
    assert len(encoded) == encoded_length
    return requests.put(url, data=bytes(encoded), headers=dict(request.headers), timeout=30)


def test_a_chunk_signed_body_is_checked_chunk_by_chunk(s3_world: World, valkey_client: Any) -> None:
    body = os.urandom(150_000)  # three chunks of data and the final empty one
    registration = s3_world.register("call.wav", declared_bytes=len(body))
    answer = chunk_signed_put(s3_world, f"{registration.pk}/call.wav", body)
    assert answer.status_code == 200, answer.text
    assert s3_world.stored(registration) == body
    [event] = events(valkey_client)
    assert event.sha256 == hashlib.sha256(body).hexdigest()


def test_a_chunk_with_a_wrong_signature_fails_the_upload_and_nothing_is_stored(
    s3_world: World, valkey_client: Any
) -> None:
    body = os.urandom(150_000)
    registration = s3_world.register("call.wav", declared_bytes=len(body))
    answer = chunk_signed_put(s3_world, f"{registration.pk}/call.wav", body, spoil_chunk=1)
    assert answer.status_code == 403
    assert "<Code>SignatureDoesNotMatch</Code>" in answer.text
    assert s3_world.stored(registration) is None
    assert events(valkey_client) == []


def test_a_multipart_upload_growing_past_the_declared_size_is_refused_and_aborted(
    s3_world: World, valkey_client: Any, tmp_path: Any
) -> None:
    from boto3.exceptions import S3UploadFailedError
    from boto3.s3.transfer import TransferConfig

    body = os.urandom(11 * 1024 * 1024)
    source = tmp_path / "long.wav"
    source.write_bytes(body)
    registration = s3_world.register("long.wav", declared_bytes=6 * 1024 * 1024)
    with pytest.raises(S3UploadFailedError) as refused:
        s3_world.client().upload_file(
            str(source),
            s3_world.bucket,
            f"{registration.pk}/long.wav",
            Config=TransferConfig(
                multipart_threshold=5 * 1024 * 1024,
                multipart_chunksize=5 * 1024 * 1024,
                max_concurrency=1,
            ),
        )
    assert "EntityTooLarge" in str(refused.value)
    assert s3_world.stored(registration) is None
    assert events(valkey_client) == []
    # boto3 aborted the upload: the registration is free for a file of the declared size.
    smaller = os.urandom(6 * 1024 * 1024)
    s3_world.client().put_object(
        Bucket=s3_world.bucket, Key=f"{registration.pk}/long.wav", Body=smaller
    )
    assert s3_world.stored(registration) == smaller
