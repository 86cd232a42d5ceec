"""Retention deletes interaction records (rows and their objects in the bucket) past each use
case's retention, audited batch by batch; a legal hold on the use case or its tenant keeps
them. Records are made by the real persisters from stream entries; objects live on a real S3
server (SeaweedFS)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import valkey
from django.test import override_settings

from governance.models import AuditEvent, UseCase
from records.interaction_retention import DELETED_ACTION, record_retention_apply
from records.interactions import records_persist
from records.models import InteractionRecord, RecordObject
from records.usage import usage_persist
from testkit.factories import make_tenant, make_use_case
from testkit.records_store import RecordsStore
from tests.records.test_records import add_record, records_keys  # noqa: F401
from tests.records.test_usage import add_usage

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 24, 12, 30, tzinfo=UTC)
OLD = NOW - timedelta(days=100)
RECENT = NOW - timedelta(days=1)


def at_ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def add_records(client: valkey.Valkey, use_case_id: int, tenant: str, tag: str) -> None:
    """For one use case: a transcript and a metadata-only record, old and recent."""
    for when, at in (("old", OLD), ("recent", RECENT)):
        common = {"use_case_id": use_case_id, "tenant": tenant, "at_ms": at_ms(at)}
        add_record(client, f"{tag}-{when}-full", **common)
        add_usage(client, record_id=f"{tag}-{when}-meta", record="metadata", **common)


def persist(client: valkey.Valkey) -> None:
    records_persist(client=client, consumer="w1")
    usage_persist(client=client, consumer="w1")


def record_ids() -> set[str]:
    return set(InteractionRecord.objects.values_list("record_id", flat=True))


def bucket_keys(store: RecordsStore) -> set[str]:
    listed = store.client().list_objects_v2(Bucket=store.bucket)
    return {item["Key"] for item in listed.get("Contents", [])}


def deletions() -> list[dict[str, Any]]:
    events = AuditEvent.objects.filter(action=DELETED_ACTION).order_by("sequence")
    return [event.after for event in events if isinstance(event.after, dict)]


@override_settings(RECORD_RETENTION_DAYS=60)
def test_records_past_retention_are_deleted_and_held_ones_are_kept(
    valkey_client: valkey.Valkey, records_store: RecordsStore
) -> None:
    # GIVEN use cases with 30 days' retention: one free, one on legal hold, one whose
    # tenant is on legal hold; and a use case id no longer in governance (default: 60 days)
    acme = make_tenant("acme")
    globex = make_tenant("globex", legal_hold=True)
    free = make_use_case(acme, "free", record_retention_days=30)
    held = make_use_case(acme, "held", record_retention_days=30, legal_hold=True)
    tenant_held = make_use_case(globex, "tenant-held", record_retention_days=30)
    for use_case, tag in ((free, "free"), (held, "held"), (tenant_held, "tenant-held")):
        add_records(valkey_client, use_case.pk, use_case.tenant.slug, tag)
    add_records(valkey_client, 999, "acme", "gone")
    persist(valkey_client)
    assert len(record_ids()) == 16
    free_old = RecordObject.objects.get(use_case_id=free.pk, hour__lt=NOW - timedelta(days=30))
    gone_old = RecordObject.objects.get(use_case_id=999, hour__lt=NOW - timedelta(days=30))
    keys_before = bucket_keys(records_store)
    assert {free_old.key, gone_old.key} <= keys_before

    # WHEN retention runs
    report = record_retention_apply(now=NOW)

    # THEN the free use case's and the unknown one's old records are gone, rows and objects
    assert record_ids() == {
        "free-recent-full",
        "free-recent-meta",
        "gone-recent-full",
        "gone-recent-meta",
        *(f"{tag}-{when}-{kind}" for tag in ("held", "tenant-held")
          for when in ("old", "recent") for kind in ("full", "meta")),
    }  # fmt: skip
    assert bucket_keys(records_store) == keys_before - {free_old.key, gone_old.key}
    assert not RecordObject.objects.filter(pk__in=[free_old.pk, gone_old.pk]).exists()
    assert (report.objects, report.records) == (2, 4)
    assert sorted(report.held) == sorted([held.pk, tenant_held.pk])

    # AND each batch is in the audit trail: use case, counts, time range, keys and checksums
    events = {(e["use_case_id"], e["objects"]): e for e in deletions()}
    assert set(events) == {(free.pk, 1), (free.pk, 0), (999, 1), (999, 0)}
    objects_batch = events[(free.pk, 1)]
    assert objects_batch["records"] == 1
    assert objects_batch["retention_days"] == 30
    assert objects_batch["object_keys"] == [
        {
            "key": free_old.key,
            "sha256": free_old.sha256,
            "sealed_sha256": free_old.sealed_sha256,
            "records": 1,
            "audit_sequence": free_old.audit_sequence,
        }
    ]
    assert objects_batch["unreferenced_keys"] == []
    assert objects_batch["from"] == OLD.isoformat()
    assert events[(free.pk, 0)]["records"] == 1  # the metadata-only row
    assert events[(999, 1)]["retention_days"] == 60
    event = AuditEvent.objects.filter(action=DELETED_ACTION).first()
    assert event is not None
    assert event.actor == "system:record-retention"

    # AND lifting the hold lets the next run delete what is past retention
    UseCase.objects.filter(pk=held.pk).update(legal_hold=False)
    report = record_retention_apply(now=NOW)
    assert (report.objects, report.records) == (1, 2)
    assert not InteractionRecord.objects.filter(record_id__startswith="held-old").exists()
    assert InteractionRecord.objects.filter(record_id__startswith="tenant-held-old").count() == 2


def test_an_object_goes_only_once_its_whole_hour_is_past_retention(
    valkey_client: valkey.Valkey, records_store: RecordsStore
) -> None:
    acme = make_tenant("acme")
    use_case = make_use_case(acme, "chat", record_retention_days=30)
    cutoff = NOW - timedelta(days=30)  # 12:30, thirty days ago
    common = {"use_case_id": use_case.pk, "tenant": "acme"}
    # Before the cutoff, but in the cutoff's hour (12:00–13:00), with a later one beside it
    add_record(valkey_client, "early", at_ms=at_ms(cutoff - timedelta(minutes=20)), **common)
    add_record(valkey_client, "later", at_ms=at_ms(cutoff + timedelta(minutes=20)), **common)
    persist(valkey_client)

    report = record_retention_apply(now=NOW)
    assert (report.objects, report.records) == (0, 0)
    assert record_ids() == {"early", "later"}

    report = record_retention_apply(now=NOW + timedelta(minutes=31))
    assert (report.objects, report.records) == (1, 2)
    assert bucket_keys(records_store) == set()


def test_an_object_no_row_names_goes_with_its_hour(
    valkey_client: valkey.Valkey, records_store: RecordsStore
) -> None:
    """GIVEN an old hour's object, and beside it one a dead batch wrote before it was retried
    under another name (no row names it) …"""
    acme = make_tenant("acme")
    use_case = make_use_case(acme, "chat", record_retention_days=30)
    add_record(valkey_client, "r1", use_case_id=use_case.pk, at_ms=at_ms(OLD))
    persist(valkey_client)
    obj = RecordObject.objects.get()
    orphan = obj.key.rsplit("/", 1)[0] + "/1-0_1-9.jsonl.gz.sealed"
    records_store.client().put_object(Bucket=records_store.bucket, Key=orphan, Body=b"sealed")

    # … WHEN retention runs while the orphan is fresh (it could be a batch mid-commit)
    report = record_retention_apply(now=NOW)
    # THEN the hour's object goes and the orphan stays, for now
    assert (report.objects, report.unreferenced) == (1, 0)
    assert bucket_keys(records_store) == {orphan}

    # AND once it is older than the grace, the next deletion in that hour takes it along
    add_record(
        valkey_client, "r2", use_case_id=use_case.pk, at_ms=at_ms(OLD + timedelta(seconds=1))
    )
    persist(valkey_client)
    report = record_retention_apply(now=NOW, orphan_grace=timedelta(0))
    assert (report.objects, report.unreferenced) == (1, 1)
    assert bucket_keys(records_store) == set()
    assert deletions()[-1]["unreferenced_keys"] == [orphan]


def test_a_large_backlog_is_deleted_in_bounded_batches_across_runs(
    valkey_client: valkey.Valkey, records_store: RecordsStore
) -> None:
    acme = make_tenant("acme")
    use_case = make_use_case(acme, "chat", record_retention_days=30)
    for hour in range(3):  # three old hours: three objects
        at = OLD + timedelta(hours=hour)
        add_record(valkey_client, f"r{hour}", use_case_id=use_case.pk, at_ms=at_ms(at))
    persist(valkey_client)
    assert RecordObject.objects.count() == 3

    first = record_retention_apply(now=NOW, objects_per_batch=1, max_batches=2)
    assert (first.objects, first.batches, first.backlog) == (2, 2, True)
    assert len(deletions()) == 2
    assert len(bucket_keys(records_store)) == 1

    second = record_retention_apply(now=NOW, objects_per_batch=1, max_batches=2)
    assert (second.objects, second.backlog) == (1, False)
    assert bucket_keys(records_store) == set()
    assert not InteractionRecord.objects.exists()


def test_retention_is_scheduled_hourly_through_its_task() -> None:
    from records.tasks import apply_record_retention

    assert apply_record_retention.name == "scheduler.apply_record_retention"
    assert apply_record_retention() == {
        "objects": 0,
        "records": 0,
        "unreferenced": 0,
        "batches": 0,
        "held": [],
        "backlog": False,
    }
