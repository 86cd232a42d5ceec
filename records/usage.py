"""Persist the gateway's accounting streams: usage roll-ups, interaction records' metadata,
the admission audit and the guardrail findings (``records.findings``).

Exactly-once effects over at-least-once delivery come from ``records.streams`` (one
persister per stream under a row lock, orphans claimed first, a committed-id cursor,
trimming only what every group acknowledged). Acknowledged entries of the last
``KEEP_ACKNOWLEDGED_MS`` (an hour) stay, for inspection and redelivery. The backlog left
(entries not yet read) is in the report, and a warning is logged when it is over
``BACKLOG_WARNING``.

Roll-ups are one ``INSERT … ON CONFLICT DO UPDATE SET n = n + excluded.n`` per (use case,
tenant, model, minute) — the same SQL on SQLite and PostgreSQL. Malformed entries are
logged, acknowledged and skipped, so one bad record cannot wedge the stream.

Interaction records (issue 12): a usage entry whose ``record`` is ``metadata``, ``full`` or
``full_dropped`` upserts its ``InteractionRecord`` in the batch's transaction (entries
without the field, written before records existed, make none). The records persister
(``records.interactions``) may have created the row first, from its self-contained
``sy:records`` entry: the upsert then refreshes the metadata and never touches the content
fields, so either order leaves the same row.

Refusals (``rejected``, ``shed``; never ``queued`` waits) also reach the hash-chained audit
trail, aggregated so that a flood of refused requests cannot flood the serial chain: one
``admission.refused`` event per (use case, model, decision, reason, minute) group of a
batch, with the count, first and last time, policy versions and the first request ids. It
is written in the batch's transaction, and each summarised row records the event's
sequence (``AdmissionDecision.audit_sequence``): a row that already has one is never
summarised again, so a redelivered batch — or a cursor reset — writes no second summary.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

import valkey
from django.conf import settings
from django.db import connection, models

from gateway.accounting import (
    BACKLOG_WARNING,
    DECISIONS_STREAM,
    GUARDRAILS_STREAM,
    PERSISTER_GROUP,
    USAGE_STREAM,
)
from governance.audit import Actor, audit_record
from governance.models import Tenant, UseCase
from records.findings import findings_store
from records.models import RECORD_METADATA_FIELDS, AdmissionDecision, InteractionRecord, UsageMinute
from records.streams import (
    StreamEntry,
    client_for,
    ensure_group,
    stream_batch,
    trim_consumed,
    unread,
)

logger = logging.getLogger(__name__)

GROUP = PERSISTER_GROUP
KEEP_ACKNOWLEDGED_MS = 3_600_000
BATCH_SIZE = 1000
_MAX_BIGINT = 2**63 - 1

# The audit trail's record of refused requests: one event per group of a batch.
REFUSAL_ACTION = "admission.refused"
REFUSAL_ACTOR = Actor.system("usage-persister")
REFUSALS = (AdmissionDecision.Kind.REJECTED, AdmissionDecision.Kind.SHED)
REFUSAL_REQUEST_IDS = 20  # request ids listed in a summary; the rest are counted


@dataclass
class PersistReport:
    """What one ``usage_persist`` run did, per stream and in total."""

    usage: int = 0  # usage entries rolled up
    records: int = 0  # interaction records' metadata upserted
    decisions: int = 0  # decisions stored
    findings: int = 0  # guardrail findings stored
    replayed: int = 0  # entries already committed, only acknowledged
    claimed: int = 0  # entries taken over from a consumer that died
    malformed: int = 0
    refusal_summaries: int = 0  # audit events written for groups of refusals
    skipped_locked: list[str] = field(default_factory=list)
    trimmed: int = 0  # entries trimmed after every group had acknowledged them
    unread: dict[str, int] = field(default_factory=dict)  # per stream, left for the next run

    def as_dict(self) -> dict[str, object]:
        return {
            "usage": self.usage,
            "records": self.records,
            "decisions": self.decisions,
            "findings": self.findings,
            "replayed": self.replayed,
            "claimed": self.claimed,
            "malformed": self.malformed,
            "refusal_summaries": self.refusal_summaries,
            "skipped_locked": self.skipped_locked,
            "trimmed": self.trimmed,
            "unread": self.unread,
        }


def default_consumer() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def usage_persist(
    *,
    client: valkey.Valkey | None = None,
    consumer: str | None = None,
    batch_size: int = BATCH_SIZE,
    max_batches: int = 20,
    keep_acknowledged_ms: int = KEEP_ACKNOWLEDGED_MS,
) -> PersistReport:
    """Drain both streams into the database, up to ``max_batches`` batches each, then trim
    what every consumer group acknowledged more than ``keep_acknowledged_ms`` ago."""
    client = client or client_for(settings.VALKEY_URL)
    consumer = consumer or default_consumer()
    report = PersistReport()
    for stream in (USAGE_STREAM, DECISIONS_STREAM, GUARDRAILS_STREAM):
        ensure_group(client, stream)
        for _ in range(max_batches):
            taken = stream_batch(
                client, stream, consumer, batch_size, report, _store_for(stream, report)
            )
            if taken is None:
                report.skipped_locked.append(stream)
                break
            if taken < batch_size:
                break
        report.trimmed += trim_consumed(client, stream, keep_acknowledged_ms)
        report.unread[stream] = left = unread(client, stream)
        if left >= BACKLOG_WARNING:
            logger.warning(
                "usage_persist_backlog stream=%s unread=%s (runs read at most %s a run)",
                stream,
                left,
                batch_size * max_batches,
            )
    return report


def _store_for(stream: str, report: PersistReport) -> Callable[[Sequence[StreamEntry]], None]:
    def store(fresh: Sequence[StreamEntry]) -> None:
        if stream == USAGE_STREAM:
            report.usage += _roll_up(fresh, report)
            report.records += _store_records(fresh)
        elif stream == GUARDRAILS_STREAM:
            report.findings += findings_store(fresh, report)
        else:
            report.decisions += _store_decisions(fresh, report)

    return store


def _text(fields: Mapping[bytes, bytes], name: str, max_length: int) -> str:
    return fields.get(name.encode(), b"").decode(errors="replace")[:max_length]


def _number(fields: Mapping[bytes, bytes], name: str, *, optional: bool = False) -> int | None:
    raw = fields.get(name.encode(), b"")
    if raw == b"" and optional:
        return None
    return max(-_MAX_BIGINT, min(_MAX_BIGINT, round(float(raw))))


def _int(fields: Mapping[bytes, bytes], name: str) -> int:
    value = _number(fields, name)
    assert value is not None
    return value


def _at(fields: Mapping[bytes, bytes]) -> datetime:
    return datetime.fromtimestamp(_int(fields, "at_ms") / 1000, tz=UTC)


RollUpKey = tuple[int, str, str, datetime]


def _roll_up(entries: Sequence[StreamEntry], report: PersistReport) -> int:
    sums: dict[RollUpKey, list[int]] = {}
    counted = 0
    for entry_id, fields in entries:
        try:
            at = _at(fields)
            key = (
                _int(fields, "use_case_id"),
                _text(fields, "tenant", 100),
                _text(fields, "model", 200),
                at.replace(second=0, microsecond=0),
            )
            status = _int(fields, "status")
            row = (
                1,
                int(status >= 400),
                _int(fields, "prompt_tokens"),
                _int(fields, "completion_tokens"),
                _int(fields, "queued_ms"),
                _int(fields, "total_ms"),
            )
        except (ValueError, OverflowError):
            report.malformed += 1
            logger.warning("usage_entry_malformed stream=%s id=%s", USAGE_STREAM, entry_id)
            continue
        totals = sums.setdefault(key, [0] * len(row))
        for index, value in enumerate(row):
            totals[index] += value
        counted += 1
    _upsert(sums)
    return counted


_COUNTERS = ("requests", "errors", "prompt_tokens", "completion_tokens", "queued_ms", "total_ms")
_KEY = ("use_case_id", "tenant", "model", "minute")


def _column(name: str) -> str:
    model_field = UsageMinute._meta.get_field(name)
    assert isinstance(model_field, models.Field)
    return model_field.column


def _upsert(sums: Mapping[RollUpKey, Sequence[int]]) -> None:
    if not sums:
        return
    quote = connection.ops.quote_name
    table = quote(UsageMinute._meta.db_table)
    columns = [quote(_column(name)) for name in (*_KEY, *_COUNTERS)]
    counters = columns[len(_KEY) :]
    sql = (
        f"INSERT INTO {table} ({', '.join(columns)}) "  # noqa: S608 (names from the model)
        f"VALUES ({', '.join(['%s'] * len(columns))}) "
        f"ON CONFLICT ({', '.join(columns[: len(_KEY)])}) DO UPDATE SET "
        + ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in counters)
    )
    rows = [
        (
            use_case_id,
            tenant,
            model,
            connection.ops.adapt_datetimefield_value(minute),
            *totals,
        )
        for (use_case_id, tenant, model, minute), totals in sums.items()
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


# What a usage entry's ``record`` says the gateway kept → the row's policy and content state.
_RECORD_KINDS: dict[str, tuple[str, str]] = {
    "metadata": ("metadata", InteractionRecord.Content.NONE),
    "full": ("full", InteractionRecord.Content.PENDING),
    "full_dropped": ("full", InteractionRecord.Content.DROPPED),
}


def record_metadata(
    fields: Mapping[bytes, bytes], tenant_id: int | None, *, policy: str
) -> InteractionRecord:
    """An unsaved ``InteractionRecord`` with the metadata of a usage (or records) entry;
    raises ValueError when the entry is not one."""
    record_id = _text(fields, "record_id", 64)
    if not record_id or len(record_id) > 40:
        raise ValueError(f"record_id {record_id!r}")
    status = _int(fields, "status")
    if not 0 <= status <= 32767:
        raise ValueError(f"status {status}")
    return InteractionRecord(
        record_id=record_id,
        request_id=_text(fields, "request_id", 128),
        occurred_at=_at(fields),
        tenant=_text(fields, "tenant", 100),
        tenant_id=tenant_id,
        use_case_id=_int(fields, "use_case_id"),
        key_id=_number(fields, "key_id", optional=True),
        model=_text(fields, "model", 200),
        endpoint=_text(fields, "endpoint", 64),
        replica=_text(fields, "replica", 300),
        status=status,
        streamed=fields.get(b"streamed", b"") in (b"1", b"true", b"True"),
        prompt_tokens=_int(fields, "prompt_tokens"),
        completion_tokens=_int(fields, "completion_tokens"),
        queued_ms=_int(fields, "queued_ms"),
        upstream_ms=_int(fields, "upstream_ms") if fields.get(b"upstream_ms") else 0,
        total_ms=_int(fields, "total_ms"),
        policy_version=_number(fields, "policy_version", optional=True),
        record_policy=policy,
    )


def tenant_for(
    fields: Mapping[bytes, bytes], tenant_of: Mapping[int, int], tenant_of_slug: Mapping[str, int]
) -> int | None:
    """The tenant a row is scoped by, as the decisions are (see ``tenants_of``)."""
    return tenant_of.get(
        _int(fields, "use_case_id"), tenant_of_slug.get(_text(fields, "tenant", 100))
    )


def _store_records(entries: Sequence[StreamEntry]) -> int:
    """Upsert the interaction records of a batch of usage entries; how many."""
    rows: dict[str, InteractionRecord] = {}
    tenant_of, tenant_of_slug = tenants_of(entries)
    for entry_id, fields in entries:
        kind = fields.get(b"record", b"").decode(errors="replace")
        if kind in ("", "none"):
            continue  # no record kept, or an entry from before records
        try:
            if kind not in _RECORD_KINDS:
                raise ValueError(f"record {kind!r}")
            policy, content = _RECORD_KINDS[kind]
            row = record_metadata(
                fields, tenant_for(fields, tenant_of, tenant_of_slug), policy=policy
            )
        except (ValueError, OverflowError) as exc:
            # Its usage is counted; only the record is lost, and says why.
            logger.warning(
                "usage_record_malformed stream=%s id=%s why=%s", USAGE_STREAM, entry_id, exc
            )
            continue
        row.content = content
        rows[row.record_id] = row  # a record id twice in a batch: the last entry wins
    upsert_record_metadata(list(rows.values()))
    return len(rows)


def upsert_record_metadata(rows: Sequence[InteractionRecord]) -> None:
    """Insert rows, or refresh the metadata of those another persister created first (their
    content columns untouched)."""
    if rows:
        InteractionRecord.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["record_id"],
            update_fields=list(RECORD_METADATA_FIELDS),
        )


def _store_decisions(entries: Sequence[StreamEntry], report: PersistReport) -> int:
    rows = []
    tenant_of, tenant_of_slug = tenants_of(entries)
    for entry_id, fields in entries:
        try:
            decision = _text(fields, "decision", 16)
            if decision not in AdmissionDecision.Kind.values:
                raise ValueError(decision)
            rows.append(
                AdmissionDecision(
                    stream_id=entry_id.decode(),
                    request_id=_text(fields, "request_id", 128),
                    record_id=_text(fields, "record_id", 40),
                    occurred_at=_at(fields),
                    decision=decision,
                    reason=_text(fields, "reason", 200),
                    tenant=_text(fields, "tenant", 100),
                    tenant_id=tenant_for(fields, tenant_of, tenant_of_slug),
                    use_case_id=_int(fields, "use_case_id"),
                    key_id=_number(fields, "key_id", optional=True),
                    model=_text(fields, "model", 200),
                    queued_ms=_int(fields, "wait_ms"),
                    policy_version=_number(fields, "policy_version", optional=True),
                    # Absent or empty (a gateway older than the field): 0, "none said".
                    retry_after_s=max(0, _number(fields, "retry_after_s", optional=True) or 0),
                )
            )
        except (ValueError, OverflowError):
            report.malformed += 1
            logger.warning("decision_entry_malformed stream=%s id=%s", DECISIONS_STREAM, entry_id)
    # The unique stream id makes a replay a no-op even if the cursor were ever reset.
    AdmissionDecision.objects.bulk_create(rows, ignore_conflicts=True)
    report.refusal_summaries += _audit_refusals(
        [row.stream_id for row in rows if row.decision in REFUSALS]
    )
    return len(rows)


def tenants_of(entries: Sequence[StreamEntry]) -> tuple[dict[int, int], dict[str, int]]:
    """The tenant ids decisions are scoped by: each use case's (a use case never changes
    tenant, whereas the slug the gateway saw can since have been renamed, even reused), and,
    for a use case unknown here, the slug's tenant now (seconds after the gateway saw it)."""
    ids, slugs = set(), set()
    for _, fields in entries:
        with contextlib.suppress(ValueError, OverflowError):
            ids.add(_int(fields, "use_case_id"))
            slugs.add(_text(fields, "tenant", 100))
    return (
        dict(UseCase.objects.filter(pk__in=ids).values_list("pk", "tenant_id")),
        dict(Tenant.objects.filter(slug__in=slugs).values_list("slug", "pk")),
    )


class RefusalKey(NamedTuple):
    """A group of refusals that one audit event summarises."""

    tenant: str
    use_case_id: int
    model: str
    decision: str
    reason: str
    minute: datetime


def _audit_refusals(stream_ids: Sequence[str]) -> int:
    """One audit event per (use case, model, decision, reason, minute) group of this batch's
    refusals not yet summarised; each summarised row points at its event."""
    if not stream_ids:
        return 0
    pending = (
        AdmissionDecision.objects.filter(stream_id__in=stream_ids, audit_sequence__isnull=True)
        .only(
            "id",
            "stream_id",
            "request_id",
            "occurred_at",
            "decision",
            "reason",
            "tenant",
            "tenant_id",
            "use_case_id",
            "model",
            "policy_version",
        )
        .order_by("occurred_at", "stream_id")
    )
    groups: dict[RefusalKey, list[AdmissionDecision]] = {}
    for row in pending:
        key = RefusalKey(
            tenant=row.tenant,
            use_case_id=row.use_case_id,
            model=row.model,
            decision=row.decision,
            reason=row.reason,
            minute=row.occurred_at.astimezone(UTC).replace(second=0, microsecond=0),
        )
        groups.setdefault(key, []).append(row)
    for key in sorted(groups):
        rows = groups[key]
        event = audit_record(
            actor=REFUSAL_ACTOR,
            action=REFUSAL_ACTION,
            # The use case whose requests were refused, by the id the gateway saw (it may be
            # unknown here, e.g. a standalone gateway's): never loaded, only named.
            obj=UseCase(pk=key.use_case_id),
            object_repr=_refusal_repr(key, len(rows)),
            tenant_slug=key.tenant[:63],
            tenant_id=rows[0].tenant_id,  # one use case, so one tenant
            after=_refusal_detail(key, rows),
        )
        AdmissionDecision.objects.filter(pk__in=[row.pk for row in rows]).update(
            audit_sequence=event.sequence
        )
    return len(groups)


def _refusal_repr(key: RefusalKey, count: int) -> str:
    reason = key.reason or "no reason"
    return f"{count} {key.decision} ({reason}) {key.model} @ {key.minute:%Y-%m-%d %H:%M}Z"


def _refusal_detail(key: RefusalKey, rows: Sequence[AdmissionDecision]) -> dict[str, Any]:
    versions = {row.policy_version for row in rows}
    return {
        "tenant": key.tenant,
        "use_case_id": key.use_case_id,
        "model": key.model,
        "decision": key.decision,
        "reason": key.reason,
        "minute": key.minute.isoformat(),
        "count": len(rows),
        "first_at": rows[0].occurred_at.astimezone(UTC).isoformat(),
        "last_at": rows[-1].occurred_at.astimezone(UTC).isoformat(),
        # None: entries that carried no policy version.
        "policy_versions": sorted(v for v in versions if v is not None)
        + ([None] if None in versions else []),
        "request_ids": [row.request_id for row in rows[:REFUSAL_REQUEST_IDS]],
        "request_ids_omitted": max(0, len(rows) - REFUSAL_REQUEST_IDS),
        "first_stream_id": rows[0].stream_id,
        "last_stream_id": rows[-1].stream_id,
    }
