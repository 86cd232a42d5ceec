"""The transcript object format and envelope encryption, against a real S3 server (SeaweedFS)."""

from __future__ import annotations

import base64
import gzip
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.test import override_settings

from records.objects import (
    ObjectCache,
    ObjectUnreadable,
    TranscriptLine,
    decode_object,
    delete_object,
    encode_object,
    field_bytes,
    object_key,
    read_object,
    text_field,
    verify_sealed,
    write_object,
)
from records.sealing import Keyring, SealError, seal, unseal
from testkit.records_store import RecordsStore


def _key(kid: str) -> str:
    return f"{kid}:{base64.b64encode(os.urandom(32)).decode()}"


def _line(record_id: str, request: bytes, response: bytes) -> TranscriptLine:
    request_text, request_encoding = text_field(request)
    response_text, response_encoding = text_field(response)
    return {
        "record_id": record_id,
        "request_id": "req-1",
        "at_ms": 1_700_000_000_000,
        "tenant": "acme",
        "use_case_id": 7,
        "key_id": 3,
        "model": "m",
        "endpoint": "/v1/chat/completions",
        "status": 200,
        "streamed": False,
        "request": request_text,
        "request_encoding": request_encoding,
        "response": response_text,
        "response_encoding": response_encoding,
        "response_type": "application/json",
        "truncated": False,
    }


def test_a_rotated_keyring_still_opens_what_the_old_key_sealed() -> None:
    old = Keyring.parse(_key("k1"))
    sealed = seal(b"the content", old)
    rotated = Keyring.parse(_key("k2") + "," + _key("k1").replace("k1:", "x:"))
    with pytest.raises(SealError, match="not in SWITCHYARD_RECORDS_KEYS"):
        unseal(sealed, rotated)
    rotated = Keyring(current="k2", keys={"k2": os.urandom(32), **old.keys})
    assert unseal(sealed, rotated) == b"the content"
    assert seal(b"new", rotated) != sealed


def test_a_sealed_object_reveals_nothing_and_any_change_fails_to_open() -> None:
    ring = Keyring.parse(_key("k1"))
    sealed = seal(b"secret customer text " * 10, ring)
    assert b"secret customer text" not in sealed
    for at in (len(sealed) // 2, len(sealed) - 1, 20):
        tampered = bytearray(sealed)
        tampered[at] ^= 0x01
        with pytest.raises(SealError):
            unseal(bytes(tampered), ring)


def test_keyring_refuses_malformed_keys() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        Keyring.parse("k1:" + base64.b64encode(b"short").decode())
    with pytest.raises(ValueError, match="kid:base64key"):
        Keyring.parse("no-separator")
    with pytest.raises(ValueError, match="twice"):
        Keyring.parse(_key("k1") + "," + _key("k1"))


def test_encoded_objects_round_trip_bytes_exactly() -> None:
    binary = bytes(range(256))
    lines = [_line("r1", b'{"a":"\xc3\xa9"}', b"data: x\n\n"), _line("r2", binary, b"")]
    encoded = encode_object(lines)
    decoded = decode_object(encoded.sealed)
    assert len(decoded) == 2
    assert verify_sealed(
        encoded.sealed, sha256=encoded.sha256, sealed_sha256=encoded.sealed_sha256
    ).ok
    import orjson

    second = orjson.loads(decoded[1])
    assert second["request_encoding"] == "base64"
    assert field_bytes(second, "request") == binary
    assert field_bytes(orjson.loads(decoded[0]), "request") == b'{"a":"\xc3\xa9"}'


def test_object_keys_name_tenant_use_case_and_hour() -> None:
    key = object_key(
        tenant_id=4,
        use_case_id=9,
        hour=datetime(2026, 11, 24, 5, tzinfo=UTC),
        first="1-0",
        last="9-1",
    )
    assert key == "transcripts/tenant=4/use_case=9/2026/11/24/05/1-0_9-1.jsonl.gz.sealed"


@pytest.mark.django_db
def test_objects_are_stored_in_s3_sealed_and_a_tampered_one_fails(
    records_store: RecordsStore,
) -> None:
    with override_settings(RECORDS_KEYS=_key("k1")):
        encoded = encode_object([_line("r1", b"question", b"answer")])
        write_object("transcripts/x/one.jsonl.gz.sealed", encoded)
        stored = read_object("transcripts/x/one.jsonl.gz.sealed")
        assert stored == encoded.sealed
        raw = (
            records_store.client()
            .get_object(Bucket=records_store.bucket, Key="transcripts/x/one.jsonl.gz.sealed")[
                "Body"
            ]
            .read()
        )
        assert b"question" not in raw
        assert b"answer" not in raw
        with pytest.raises(OSError, match="Not a gzipped file"):
            gzip.decompress(raw)  # sealed, not merely compressed
        cache = ObjectCache()
        line = cache.line(
            "transcripts/x/one.jsonl.gz.sealed", encoded.sealed_sha256, 0, encoded.line_sha256[0]
        )
        assert field_bytes(line, "response") == b"answer"

        tampered = bytearray(raw)
        tampered[-3] ^= 0xFF
        records_store.client().put_object(
            Bucket=records_store.bucket,
            Key="transcripts/x/one.jsonl.gz.sealed",
            Body=bytes(tampered),
        )
        verdict = verify_sealed(
            read_object("transcripts/x/one.jsonl.gz.sealed"),
            sha256=encoded.sha256,
            sealed_sha256=encoded.sealed_sha256,
        )
        assert not verdict.ok
        assert "differ" in verdict.problem
        with pytest.raises(ObjectUnreadable):
            ObjectCache().lines("transcripts/x/one.jsonl.gz.sealed", encoded.sealed_sha256)


def test_the_filesystem_backend_stores_overwrites_and_deletes_objects(tmp_path: Path) -> None:
    """The smallest installs keep objects on disk (SWITCHYARD_OBJECT_STORAGE=filesystem): a
    batch written again after a crash must replace its object, not sit beside it."""
    from django.conf import settings

    storages = {
        **settings.STORAGES,
        "records": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path), "allow_overwrite": True},
        },
    }
    with override_settings(STORAGES=storages, RECORDS_KEYS=_key("k1")):
        first = encode_object([_line("r1", b"question", b"first answer")])
        again = encode_object([_line("r1", b"question", b"second answer")])
        write_object("transcripts/t/a.jsonl.gz.sealed", first)
        write_object("transcripts/t/a.jsonl.gz.sealed", again)
        assert [p.name for p in (tmp_path / "transcripts" / "t").iterdir()] == ["a.jsonl.gz.sealed"]
        assert read_object("transcripts/t/a.jsonl.gz.sealed") == again.sealed
        assert b"second answer" not in (tmp_path / "transcripts/t/a.jsonl.gz.sealed").read_bytes()
        delete_object("transcripts/t/a.jsonl.gz.sealed")
        with pytest.raises(ObjectUnreadable):
            read_object("transcripts/t/a.jsonl.gz.sealed")
