"""A transcript object is verified against its row, the audit event that recorded its
checksums, and its seal: a changed object fails, and so does one swapped for another
genuine object. Objects are changed behind the persister's back, through the S3 API."""

from __future__ import annotations

import io

import pytest
import valkey
from django.core.management import call_command

from records.interactions import records_persist, records_verify
from records.models import RecordObject
from testkit.records_store import RecordsStore
from tests.records.test_records import AT, add_record, records_keys  # noqa: F401
from tests.records.test_usage import ms

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_objects(valkey_client: valkey.Valkey, records_store: RecordsStore) -> list[RecordObject]:
    """Two genuine objects: use case 7's (two records) and use case 8's (one)."""
    add_record(valkey_client, "a1")
    add_record(valkey_client, "a2", at_ms=ms(AT, 1))
    add_record(valkey_client, "b1", use_case_id=8)
    records_persist(client=valkey_client, consumer="w1")
    objects = list(RecordObject.objects.order_by("use_case_id"))
    assert [o.use_case_id for o in objects] == [7, 8]
    return objects


def _put(store: RecordsStore, key: str, body: bytes) -> None:
    store.client().put_object(Bucket=store.bucket, Key=key, Body=body)


def _get(store: RecordsStore, key: str) -> bytes:
    body: bytes = store.client().get_object(Bucket=store.bucket, Key=key)["Body"].read()
    return body


def test_genuine_objects_verify(two_objects: list[RecordObject]) -> None:
    for obj in two_objects:
        assert records_verify(obj).ok
    out = io.StringIO()
    call_command("records_verify", stdout=out)
    assert "2 verified" in out.getvalue()


def test_an_object_changed_in_the_bucket_fails(
    two_objects: list[RecordObject], records_store: RecordsStore
) -> None:
    obj = two_objects[0]
    tampered = bytearray(_get(records_store, obj.key))
    tampered[len(tampered) // 2] ^= 0x01
    _put(records_store, obj.key, bytes(tampered))

    verdict = records_verify(obj)

    assert not verdict.ok
    assert verdict.problem == "the stored bytes differ from the checksum recorded"
    assert records_verify(two_objects[1]).ok


def test_an_object_swapped_for_another_genuine_one_fails(
    two_objects: list[RecordObject], records_store: RecordsStore
) -> None:
    ours, theirs = two_objects
    _put(records_store, ours.key, _get(records_store, theirs.key))

    verdict = records_verify(ours)
    assert not verdict.ok
    assert "differ" in verdict.problem

    # AND a row edited to the swapped object's checksums fails on the audit event instead
    RecordObject.objects.filter(pk=ours.pk).update(
        sha256=theirs.sha256, sealed_sha256=theirs.sealed_sha256, size=theirs.size, records=1
    )
    ours.refresh_from_db()
    verdict = records_verify(ours)
    assert not verdict.ok
    assert f"differs from what audit event {ours.audit_sequence} recorded" in verdict.problem


def test_a_missing_object_fails(
    two_objects: list[RecordObject], records_store: RecordsStore
) -> None:
    records_store.client().delete_object(Bucket=records_store.bucket, Key=two_objects[1].key)
    verdict = records_verify(two_objects[1])
    assert not verdict.ok
    assert "could not be read" in verdict.problem


def test_the_command_names_the_first_object_that_fails_and_exits_non_zero(
    two_objects: list[RecordObject], records_store: RecordsStore
) -> None:
    bad = two_objects[1]
    tampered = bytearray(_get(records_store, bad.key))
    tampered[-1] ^= 0x01
    _put(records_store, bad.key, bytes(tampered))

    err = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("records_verify", stderr=err)
    assert exited.value.code == 1
    assert bad.key in err.getvalue()
    assert "differ from the checksum recorded" in err.getvalue()

    # Only use case 7's objects: intact
    out = io.StringIO()
    call_command("records_verify", "--use-case", "7", stdout=out)
    assert "1 verified" in out.getvalue()
