"""Retention and legal hold for interaction records: delete what is past each use case's
``record_retention_days``, unless the use case or its tenant is on legal hold.

A use case id no longer in governance (deleted, or a standalone gateway's) gets
``RECORD_RETENTION_DAYS``; its records are still held when their tenant is.

An object holds one use case × one hour, so it goes once its whole hour is past the cutoff:
in one transaction, the object is deleted from storage first, then its rows, the
``RecordObject`` and an audit event — a crash in between leaves rows whose object is gone,
which the next run deletes (deleting a missing object is a no-op). Metadata-only rows (no
object) go by their own time. With an hour's objects go the objects under the same
prefix that no row names, written at least ``ORPHAN_GRACE`` ago: a batch that died after
writing them and was retried under other names (its batch size or a use case's tenant
changed meanwhile) — content that would otherwise outlive its retention. Work is in bounded
batches (``OBJECTS_PER_BATCH`` objects,
``ROWS_PER_BATCH`` rows), at most ``MAX_BATCHES`` a run; the next run carries on. Every batch
is one ``records.deleted`` audit event: the use case, the counts, the time range, and each
object's key with its checksums.

The holds read at the start only plan the run: each batch re-reads them with the use case's
and tenants' rows locked, first in the transaction that deletes (storage included), so a hold
placed while a run is under way stops it before its next batch. The price: a batch holds those
row locks (on SQLite, the write lock) while it deletes its objects from storage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Min
from django.utils import timezone

from governance.audit import Actor, audit_record
from governance.models import Tenant, UseCase
from records.models import InteractionRecord, RecordObject
from records.objects import delete_object, records_storage

logger = logging.getLogger(__name__)

OBJECTS_PER_BATCH = 100
ROWS_PER_BATCH = 5000
MAX_BATCHES = 5
DELETED_ACTION = "records.deleted"
ACTOR = Actor.system("record-retention")
ORPHAN_GRACE = timedelta(hours=1)  # an unnamed object younger than this may be mid-commit
_HOUR = timedelta(hours=1)


@dataclass
class RecordRetentionReport:
    objects: int = 0  # objects deleted (storage and row)
    records: int = 0  # InteractionRecord rows deleted, with or without content
    unreferenced: int = 0  # objects no row named, deleted with their hour
    batches: int = 0  # audit events written
    held: list[int] = field(default_factory=list)  # use case ids kept by a legal hold
    backlog: bool = False  # stopped at the run's batch budget; the next run carries on

    def as_dict(self) -> dict[str, object]:
        return {
            "objects": self.objects,
            "records": self.records,
            "unreferenced": self.unreferenced,
            "batches": self.batches,
            "held": self.held,
            "backlog": self.backlog,
        }


@dataclass(frozen=True)
class _Policy:
    use_case_id: int
    days: int
    held: bool  # the use case, or its tenant, is on legal hold
    tenant_id: int | None
    tenant: str


def record_retention_apply(
    *,
    now: datetime | None = None,
    objects_per_batch: int = OBJECTS_PER_BATCH,
    rows_per_batch: int = ROWS_PER_BATCH,
    max_batches: int = MAX_BATCHES,
    orphan_grace: timedelta = ORPHAN_GRACE,
    on_batch: Callable[[], None] | None = None,
) -> RecordRetentionReport:
    """Delete records past retention, in at most ``max_batches`` audited batches.

    ``on_batch`` is called after each batch is selected and before it is deleted: the seam
    where a test places a legal hold mid-run (each batch re-checks the holds under lock)."""
    now = now or timezone.now()
    report = RecordRetentionReport()
    held_tenants = set(Tenant.objects.filter(legal_hold=True).values_list("pk", flat=True))
    for policy in _policies(held_tenants):
        if policy.held:
            report.held.append(policy.use_case_id)
            continue
        cutoff = now - timedelta(days=policy.days)
        budget = (objects_per_batch, rows_per_batch, max_batches)
        if not _apply(policy, cutoff, held_tenants, budget, orphan_grace, report, on_batch):
            report.backlog = True
            break
    logger.info(
        "record_retention_applied %s", " ".join(f"{k}={v}" for k, v in report.as_dict().items())
    )
    return report


def _policies(held_tenants: set[int]) -> Iterator[_Policy]:
    """Every use case id that has records, with its retention and hold."""
    ids = set(InteractionRecord.objects.values_list("use_case_id", flat=True).distinct())
    ids |= set(RecordObject.objects.values_list("use_case_id", flat=True).distinct())
    known = {
        use_case.pk: use_case
        for use_case in UseCase.objects.filter(pk__in=ids).select_related("tenant")
    }
    for use_case_id in sorted(ids):
        use_case = known.get(use_case_id)
        if use_case is None:
            # Gone from governance: the default age; a tenant hold still applies row by row.
            yield _Policy(use_case_id, settings.RECORD_RETENTION_DAYS, False, None, "")
            continue
        yield _Policy(
            use_case_id,
            use_case.record_retention_days,
            use_case.legal_hold or use_case.tenant_id in held_tenants,
            use_case.tenant_id,
            use_case.tenant.slug,
        )


def _apply(
    policy: _Policy,
    cutoff: datetime,
    held_tenants: set[int],
    budget: tuple[int, int, int],
    orphan_grace: timedelta,
    report: RecordRetentionReport,
    on_batch: Callable[[], None] | None,
) -> bool:
    """Batches for one use case while the run's budget lasts; False when it ran out.

    What a batch selects is only a candidate: the batch re-reads the holds under a lock
    before it deletes anything (``_locked_holds``), and a hold found there ends the use case's
    part of the run, or drops a newly held tenant's records from it."""
    objects_per_batch, rows_per_batch, max_batches = budget
    while True:
        if report.batches >= max_batches:
            return False
        batch = list(
            RecordObject.objects.filter(use_case_id=policy.use_case_id, hour__lte=cutoff - _HOUR)
            .exclude(tenant_id__in=held_tenants)
            .order_by("hour", "pk")[:objects_per_batch]
        )
        if batch:
            if on_batch is not None:
                on_batch()
            if not _delete_objects(policy, batch, held_tenants, orphan_grace, report):
                report.held.append(policy.use_case_id)
                return True
            continue
        ids = list(
            InteractionRecord.objects.filter(
                use_case_id=policy.use_case_id, occurred_at__lt=cutoff, object__isnull=True
            )
            .exclude(tenant_id__in=held_tenants)
            .order_by("occurred_at", "pk")
            .values_list("pk", flat=True)[:rows_per_batch]
        )
        if not ids:
            return True
        if on_batch is not None:
            on_batch()
        if not _delete_rows(policy, ids, held_tenants, report):
            report.held.append(policy.use_case_id)
            return True


def _locked_holds(policy: _Policy, tenant_ids: set[int], held_tenants: set[int]) -> bool:
    """Lock the use case's row and its records' tenants' rows and read their holds; False
    when the use case (or its own tenant) is held now. Tenants found held join
    ``held_tenants``, so the caller leaves their records out.

    Called first in the deleting transaction: a hold committed after the batch was selected
    is seen here, and one placed from now on waits until the batch is committed. The row
    locks are PostgreSQL's ``FOR UPDATE``; on SQLite, transactions are ``IMMEDIATE``
    (config/settings.py), so the write lock is held from the start of the transaction."""
    use_case = list(
        UseCase.objects.select_for_update()
        .filter(pk=policy.use_case_id)
        .values_list("legal_hold", "tenant_id")
    )
    if use_case:
        tenant_ids = tenant_ids | {use_case[0][1]}
    held_tenants |= set(
        Tenant.objects.select_for_update()
        .filter(pk__in=tenant_ids, legal_hold=True)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    if not use_case:
        return True  # gone from governance: only a tenant hold applies, row by row
    held, tenant_id = use_case[0]
    return not held and tenant_id not in held_tenants


def _delete_objects(
    policy: _Policy,
    batch: list[RecordObject],
    held_tenants: set[int],
    orphan_grace: timedelta,
    report: RecordRetentionReport,
) -> bool:
    """Delete one batch of objects with their rows; False, deleting nothing, when the use
    case is held now. The storage deletes run inside the transaction, after the holds are
    read under lock, so no hold can be placed between the check and the delete."""
    with transaction.atomic():
        tenant_ids = {obj.tenant_id for obj in batch if obj.tenant_id is not None}
        if not _locked_holds(policy, tenant_ids, held_tenants):
            return False
        # Read again under lock: a key rotation's re-wrap may have moved an object meanwhile.
        batch = [
            obj
            for obj in RecordObject.objects.select_for_update()
            .filter(pk__in=[obj.pk for obj in batch])
            .order_by("hour", "pk")
            if obj.tenant_id not in held_tenants
        ]
        if not batch:
            return True  # a tenant is held now: the next selection leaves it out
        unreferenced = _unreferenced(batch, orphan_grace)
        for key in [obj.key for obj in batch] + unreferenced:
            delete_object(key)  # first: a row left behind is retried, content never is
        lines = InteractionRecord.objects.filter(object__in=batch)
        span = lines.aggregate(first=Min("occurred_at"), last=Max("occurred_at"))
        records, _ = lines.delete()
        RecordObject.objects.filter(pk__in=[obj.pk for obj in batch]).delete()
        _audit(
            policy,
            records=records,
            first=span["first"] or batch[0].hour,
            last=span["last"] or batch[-1].hour + _HOUR,
            objects=[
                {
                    "key": obj.key,
                    "sha256": obj.sha256,
                    "sealed_sha256": obj.sealed_sha256,
                    "records": obj.records,
                    "audit_sequence": obj.audit_sequence,
                }
                for obj in batch
            ],
            unreferenced=unreferenced,
        )
    report.objects += len(batch)
    report.unreferenced += len(unreferenced)
    report.records += records
    report.batches += 1
    return True


def _unreferenced(batch: list[RecordObject], grace: timedelta) -> list[str]:
    """Objects in the batch's hour prefixes that no ``RecordObject`` names, older than
    ``grace`` by the storage's clock (one listing per use case × hour)."""
    storage = records_storage()
    found: list[str] = []
    for prefix in sorted({obj.key.rsplit("/", 1)[0] for obj in batch}):
        _, files = storage.listdir(prefix)
        found += [f"{prefix}/{name}" for name in files]
    named = set(RecordObject.objects.filter(key__in=found).values_list("key", flat=True))
    settled = timezone.now() - grace
    return sorted(
        key for key in found if key not in named and storage.get_modified_time(key) <= settled
    )


def _delete_rows(
    policy: _Policy, ids: list[int], held_tenants: set[int], report: RecordRetentionReport
) -> bool:
    """Delete one batch of metadata-only rows; False, deleting nothing, when the use case is
    held now."""
    with transaction.atomic():
        rows = InteractionRecord.objects.filter(pk__in=ids)
        tenant_ids = {
            tenant_id
            for tenant_id in rows.values_list("tenant_id", flat=True).distinct()
            if tenant_id is not None
        }
        if not _locked_holds(policy, tenant_ids, held_tenants):
            return False
        rows = rows.exclude(tenant_id__in=held_tenants)
        span = rows.aggregate(first=Min("occurred_at"), last=Max("occurred_at"))
        records, _ = rows.delete()
        if not records:
            return True  # a tenant is held now: the next selection leaves it out
        _audit(
            policy,
            records=records,
            first=span["first"],
            last=span["last"],
            objects=[],
            unreferenced=[],
        )
    report.records += records
    report.batches += 1
    return True


def _audit(
    policy: _Policy,
    *,
    records: int,
    first: datetime | None,
    last: datetime | None,
    objects: list[dict[str, Any]],
    unreferenced: list[str],
) -> None:
    audit_record(
        actor=ACTOR,
        action=DELETED_ACTION,
        # By the id the records carry: the use case may be gone from governance.
        obj=UseCase(pk=policy.use_case_id),
        object_repr=f"{records} records, {len(objects)} objects of use case {policy.use_case_id}",
        tenant_slug=policy.tenant[:63],
        tenant_id=policy.tenant_id,
        after={
            "use_case_id": policy.use_case_id,
            "retention_days": policy.days,
            "records": records,
            "objects": len(objects),
            "from": first.astimezone(UTC).isoformat() if first else None,
            "to": last.astimezone(UTC).isoformat() if last else None,
            "object_keys": objects,
            "unreferenced_keys": unreferenced,
        },
    )
