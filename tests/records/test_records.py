"""Persisting interaction records: metadata rows from ``sy:usage``, transcripts from
``sy:records`` into sealed objects on a real S3 server (SeaweedFS), exactly once.

Entries are written with the gateway's field schemas into a real Valkey; objects go through
django-storages to the ``records_store`` bucket and are read back from it.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
import valkey
from django.forms.models import model_to_dict
from django.test import override_settings

from gateway.accounting import (
    DECISIONS_STREAM,
    GUARDRAIL_FIELDS,
    GUARDRAILS_STREAM,
    RECORD_FIELDS,
    RECORDS_STREAM,
)
from governance.models import AuditEvent
from records.interactions import (
    STORED_ACTION,
    StorageUnavailable,
    records_persist,
    records_verify,
    stored_detail,
)
from records.models import (
    AdmissionDecision,
    GuardrailFinding,
    InteractionRecord,
    RecordObject,
    StreamCursor,
)
from records.objects import decode_object, field_bytes, read_object
from records.streams import GROUP
from records.usage import usage_persist
from testkit.records_store import RecordsStore
from tests.records.test_usage import add_decision, add_usage, ms, pending

pytestmark = pytest.mark.django_db

AT = datetime(2025, 3, 4, 14, 2, 5, tzinfo=UTC)
HOUR_14 = datetime(2025, 3, 4, 14, tzinfo=UTC)
HOUR_15 = datetime(2025, 3, 4, 15, tzinfo=UTC)


@pytest.fixture(autouse=True)
def records_keys() -> Iterator[str]:
    """A key-encryption key of the test's own (what production must configure)."""
    keys = f"k1:{base64.b64encode(os.urandom(32)).decode()}"
    with override_settings(RECORDS_KEYS=keys):
        yield keys


def record_fields(record_id: str, **values: object) -> dict[str, str]:
    """A ``sy:records`` entry as the gateway writes it: every usage field plus content."""
    fields: dict[str, object] = dict.fromkeys(RECORD_FIELDS, "")
    fields.update(
        request_id=f"req-{record_id}",
        at_ms=ms(AT),
        tenant="acme",
        use_case_id=7,
        key_id=11,
        model="llama-test",
        replica="http://10.0.0.5:8000",
        status=200,
        prompt_tokens=100,
        completion_tokens=10,
        queued_ms=0,
        upstream_ms=90,
        total_ms=95,
        policy_version=3,
        record_id=record_id,
        endpoint="/v1/chat/completions",
        streamed=0,
        record="full",
        request=f'{{"messages":[{{"role":"user","content":"question {record_id}"}}]}}',
        response=f'{{"choices":[{{"message":{{"content":"answer {record_id}"}}}}]}}',
        response_type="application/json",
        truncated=0,
    )
    fields.update(values)
    return {k: v if isinstance(v, str) else str(v) for k, v in fields.items()}


def add_record(client: valkey.Valkey, record_id: str, **values: object) -> bytes:
    raw = values.pop("raw", None)
    fields: dict[str, Any] = record_fields(record_id, **values)
    if isinstance(raw, dict):
        fields.update(raw)  # bytes that are not text
    entry_id: Any = client.xadd(RECORDS_STREAM, fields)
    return entry_id


def add_full(client: valkey.Valkey, record_id: str, **values: object) -> None:
    """Both entries the gateway writes for a request of a ``full`` use case."""
    add_record(client, record_id, **values)
    usage = {k: v for k, v in record_fields(record_id, **values).items() if k in _USAGE_ONLY}
    add_usage(client, **usage)


_USAGE_ONLY = set(RECORD_FIELDS) - {"request", "response", "response_type", "truncated"}


def transcript(record_id: str) -> dict[str, Any]:
    """A stored record's line, read back from its object in the bucket."""
    row = InteractionRecord.objects.select_related("object").get(record_id=record_id)
    assert row.object is not None
    assert row.line is not None
    line: dict[str, Any] = orjson.loads(decode_object(read_object(row.object.key))[row.line])
    return line


def test_full_records_are_sealed_into_one_object_per_use_case_and_hour(
    valkey_client: valkey.Valkey, records_store: RecordsStore
) -> None:
    # GIVEN three requests of use case 7 at 14h, one at 15h, one of use case 8 at 14h; one
    # streamed, one answered with bytes that are not UTF-8
    add_record(valkey_client, "a1")
    add_record(valkey_client, "a2", streamed=1, response="data: {}\n\ndata: [DONE]\n\n")
    add_record(valkey_client, "a3", raw={"response": b"\xff\xfe binary"}, response_type="x/y")
    add_record(valkey_client, "b1", at_ms=ms(AT, 3600))
    add_record(valkey_client, "c1", use_case_id=8)

    # WHEN the records persister runs
    report = records_persist(client=valkey_client, consumer="w1")

    # THEN three objects, named by tenant, use case and hour, hold the five transcripts
    assert (report.stored, report.objects, report.malformed) == (5, 3, 0)
    objects = {(o.use_case_id, o.hour): o for o in RecordObject.objects.all()}
    assert sorted(objects) == [(7, HOUR_14), (7, HOUR_15), (8, HOUR_14)]
    assert objects[(7, HOUR_14)].records == 3
    assert "/use_case=7/2025/03/04/14/" in objects[(7, HOUR_14)].key
    listed = records_store.client().list_objects_v2(Bucket=records_store.bucket)["Contents"]
    assert sorted(item["Key"] for item in listed) == sorted(o.key for o in objects.values())
    # … byte for byte as answered, and sealed in the bucket
    assert field_bytes(transcript("a1"), "request") == (
        b'{"messages":[{"role":"user","content":"question a1"}]}'
    )
    assert field_bytes(transcript("a2"), "response") == b"data: {}\n\ndata: [DONE]\n\n"
    assert transcript("a2")["streamed"] is True
    assert field_bytes(transcript("a3"), "response") == b"\xff\xfe binary"
    assert transcript("a3")["response_type"] == "x/y"
    raw = (
        records_store.client()
        .get_object(Bucket=records_store.bucket, Key=objects[(7, HOUR_14)].key)["Body"]
        .read()
    )
    assert b"question a1" not in raw
    # … each row stored, pointing at its line
    rows = {row.record_id: row for row in InteractionRecord.objects.all()}
    assert {row.content for row in rows.values()} == {"stored"}
    assert [rows[r].line for r in ("a1", "a2", "a3")] == [0, 1, 2]
    assert rows["a1"].record_policy == "full"
    assert (rows["a1"].tenant, rows["a1"].model, rows["a1"].status) == ("acme", "llama-test", 200)
    # … each object's checksums in the audit trail, and every object verifies
    for obj in objects.values():
        assert obj.audit_sequence is not None
        event = AuditEvent.objects.get(sequence=obj.audit_sequence)
        assert event.action == STORED_ACTION
        assert event.after == stored_detail(obj)
        assert records_verify(obj).ok
    # … and nothing is left pending
    assert pending(valkey_client, RECORDS_STREAM) == 0


def _comparable(record_id: str) -> dict[str, Any]:
    row = InteractionRecord.objects.get(record_id=record_id)
    data = model_to_dict(row, exclude=["id", "record_id", "request_id", "object", "line"])
    data.pop("content_sha256")
    return data


def test_usage_first_and_records_first_leave_the_same_row(
    valkey_client: valkey.Valkey, records_store: RecordsStore
) -> None:
    # GIVEN request "early" whose usage is persisted before its transcript …
    add_full(valkey_client, "early", truncated=1)
    usage_persist(client=valkey_client, consumer="w1")
    pending_row = InteractionRecord.objects.get(record_id="early")
    assert (pending_row.content, pending_row.record_policy) == ("pending", "full")
    records_persist(client=valkey_client, consumer="w1")

    # … and request "late" whose transcript is persisted first
    add_full(valkey_client, "late", truncated=1)
    records_persist(client=valkey_client, consumer="w1")
    assert InteractionRecord.objects.get(record_id="late").content == "stored"
    usage_persist(client=valkey_client, consumer="w1")

    # THEN both rows are the same, stored, with the metadata and the content's state
    early, late = _comparable("early"), _comparable("late")
    assert early == late
    assert early["content"] == "stored"
    assert early["truncated"] is True
    assert early["endpoint"] == "/v1/chat/completions"
    assert InteractionRecord.objects.get(record_id="late").object is not None


def test_the_record_field_decides_which_row_a_usage_entry_makes(
    valkey_client: valkey.Valkey,
) -> None:
    add_usage(valkey_client, record_id="m1", record="metadata", endpoint="/v1/embeddings")
    add_usage(valkey_client, record_id="d1", record="full_dropped", streamed=1)
    add_usage(valkey_client, record_id="n1", record="none")
    add_usage(valkey_client, request_id="from-before-records")  # no record fields at all
    add_usage(valkey_client, record_id="", record="metadata")  # malformed: no record id
    add_usage(valkey_client, record_id="x1", record="sometimes")  # malformed: unknown kind

    report = usage_persist(client=valkey_client, consumer="w1")

    assert report.usage == 6  # every request counts in the roll-ups
    assert report.records == 2
    rows = {row.record_id: row for row in InteractionRecord.objects.all()}
    assert set(rows) == {"m1", "d1"}
    assert (rows["m1"].content, rows["m1"].record_policy) == ("none", "metadata")
    assert rows["m1"].endpoint == "/v1/embeddings"
    assert (rows["d1"].content, rows["d1"].record_policy, rows["d1"].streamed) == (
        "dropped",
        "full",
        True,
    )
    assert rows["m1"].key_id == 11
    assert rows["m1"].upstream_ms == 90


def test_decisions_and_findings_carry_the_record_id(valkey_client: valkey.Valkey) -> None:
    add_decision(valkey_client, request_id="r1", record_id="rec-1")
    finding: dict[str, object] = dict.fromkeys(GUARDRAIL_FIELDS, "")
    finding.update(
        request_id="r1",
        at_ms=ms(AT),
        tenant="acme",
        use_case_id=7,
        model="m",
        stage="request",
        guardrail="pii",
        action="redacted",
        entities='{"EMAIL_ADDRESS": 1}',
        score="0.9",
        record_id="rec-1",
    )
    valkey_client.xadd(GUARDRAILS_STREAM, {k: str(v) for k, v in finding.items()})

    usage_persist(client=valkey_client, consumer="w1")

    assert AdmissionDecision.objects.get(request_id="r1").record_id == "rec-1"
    assert GuardrailFinding.objects.get(request_id="r1").record_id == "rec-1"
    assert pending(valkey_client, DECISIONS_STREAM) == 0


def test_a_redelivered_entry_is_only_acknowledged(
    valkey_client: valkey.Valkey, records_store: RecordsStore
) -> None:
    # GIVEN a batch that was stored …
    for n in range(4):
        add_record(valkey_client, f"r{n}")
    records_persist(client=valkey_client, consumer="w1")
    stored = {row.record_id: row.content_sha256 for row in InteractionRecord.objects.all()}
    keys = list(RecordObject.objects.values_list("key", flat=True))

    # WHEN its entries are delivered again to a worker that died before XACK …
    valkey_client.xgroup_setid(RECORDS_STREAM, GROUP, "0")
    valkey_client.xreadgroup(GROUP, "killed-worker", {RECORDS_STREAM: ">"})
    report = records_persist(client=valkey_client, consumer="w2")
    # THEN they are recognised by the cursor and acknowledged only
    assert (report.claimed, report.replayed, report.stored, report.objects) == (4, 4, 0, 0)

    # AND even with the cursor lost, the gateway writing one of them again with a new id
    StreamCursor.objects.filter(stream=RECORDS_STREAM).update(last_id="0-0")
    valkey_client.xgroup_setid(RECORDS_STREAM, GROUP, "0")
    add_record(valkey_client, "r2")
    report = records_persist(client=valkey_client, consumer="w3")
    assert (report.duplicates, report.stored, report.objects) == (4, 0, 0)

    # … nothing was written twice, and every object still verifies
    assert {row.record_id: row.content_sha256 for row in InteractionRecord.objects.all()} == stored
    assert list(RecordObject.objects.values_list("key", flat=True)) == keys
    listed = records_store.client().list_objects_v2(Bucket=records_store.bucket)["Contents"]
    assert [item["Key"] for item in listed] == keys
    assert all(records_verify(obj).ok for obj in RecordObject.objects.all())
    assert pending(valkey_client, RECORDS_STREAM) == 0


def test_object_storage_refusing_writes_commits_nothing_and_acknowledges_nothing(
    valkey_client: valkey.Valkey, records_store: RecordsStore
) -> None:
    from django.conf import settings

    for n in range(3):
        add_record(valkey_client, f"r{n}")
    # GIVEN the S3 server refusing the persister's signature (a wrong secret key)
    wrong = {**settings.STORAGES["records"]}
    wrong["OPTIONS"] = {**wrong["OPTIONS"], "secret_key": "not-the-secret"}  # type: ignore[dict-item]
    # WHEN the persister runs
    with (
        override_settings(STORAGES={**settings.STORAGES, "records": wrong}),
        pytest.raises(StorageUnavailable, match="could not be written"),
    ):
        records_persist(client=valkey_client, consumer="w1")

    # THEN nothing reached the database, and the entries wait, unacknowledged
    assert not InteractionRecord.objects.exists()
    assert not RecordObject.objects.exists()
    assert not AuditEvent.objects.filter(action=STORED_ACTION).exists()
    assert StreamCursor.objects.get(stream=RECORDS_STREAM).last_id == "0-0"
    assert pending(valkey_client, RECORDS_STREAM) == 3
    assert valkey_client.xlen(RECORDS_STREAM) == 3

    # AND once storage answers again, the next run stores them all
    report = records_persist(client=valkey_client, consumer="w2", keep_acknowledged_ms=0)
    assert (report.claimed, report.stored, report.objects) == (3, 3, 1)
    assert InteractionRecord.objects.filter(content="stored").count() == 3
    assert valkey_client.xlen(RECORDS_STREAM) == 0


def test_acknowledged_content_is_trimmed_and_unread_entries_are_not(
    valkey_client: valkey.Valkey, records_store: RecordsStore
) -> None:
    ids = [add_record(valkey_client, f"r{n}") for n in range(5)]

    # A run that reads only three of them (one batch of three)
    report = records_persist(
        client=valkey_client, consumer="w1", batch_size=3, max_batches=1, keep_acknowledged_ms=0
    )

    assert (report.stored, report.trimmed, report.unread) == (3, 3, 2)
    assert [entry_id for entry_id, _ in valkey_client.xrange(RECORDS_STREAM)] == ids[3:]

    # The default keeps acknowledged entries a minute at most (not an hour, as usage does)
    report = records_persist(client=valkey_client, consumer="w1")
    assert (report.stored, report.trimmed) == (2, 0)
    assert valkey_client.xlen(RECORDS_STREAM) == 2
    from records.interactions import KEEP_ACKNOWLEDGED_MS

    assert KEEP_ACKNOWLEDGED_MS <= 60_000


def test_malformed_entries_are_skipped_and_do_not_wedge_the_stream(
    valkey_client: valkey.Valkey, records_store: RecordsStore
) -> None:
    add_record(valkey_client, "good")
    add_record(valkey_client, "bad-time", at_ms="yesterday")
    add_record(valkey_client, "")  # no record id
    valkey_client.xadd(RECORDS_STREAM, {"request": "only content"})
    add_record(valkey_client, "bad-status", status="ok")

    report = records_persist(client=valkey_client, consumer="w1")

    assert (report.malformed, report.stored) == (4, 1)
    assert list(InteractionRecord.objects.values_list("record_id", flat=True)) == ["good"]
    assert pending(valkey_client, RECORDS_STREAM) == 0


def test_the_persist_records_task_is_scheduled() -> None:
    from config.celery import app

    beat = app.conf.beat_schedule
    assert beat["persist-records"]["task"] == "scheduler.persist_records"
    assert beat["persist-records"]["schedule"] == 5.0
    assert beat["apply-record-retention"]["task"] == "scheduler.apply_record_retention"
    assert beat["apply-record-retention"]["schedule"] == 3600.0
