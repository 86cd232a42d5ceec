"""Persist the gateway's accounting streams: usage roll-ups, the admission audit and the
guardrail findings (``scheduler.findings``).

Exactly-once effects over at-least-once delivery, in three parts:

1. **One persister at a time per stream.** A run takes the stream's ``StreamCursor`` row
   lock (``SELECT … FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` serialises writers anyway)
   and keeps it until it commits. A concurrent run finds the row locked and leaves.
2. **Orphans first.** Holding the lock, everything pending in the consumer group belongs to
   a run that has ended — it died before COMMIT, or between COMMIT and XACK. The run claims
   all of it (``XAUTOCLAIM`` with no idle threshold: waiting for an idle time would let new
   entries be committed past the orphans) before it reads new entries (``XREADGROUP >``),
   so entries are committed in id order.
3. **A committed-id cursor.** The cursor advances to the batch's last id in the same
   transaction as the upserts; an entry at or below it was already counted (its run died
   before XACK) and is only acknowledged.

4. **Trimming only what is done.** The gateway never trims the streams; after each run the
   persister trims the entries every consumer group of the stream has read and
   acknowledged (``XTRIM MINID``, below the oldest entry still pending or undelivered in any
   group), so a lagging persister loses nothing; acknowledged entries of the last
   ``KEEP_ACKNOWLEDGED_MS`` (an hour) stay, for inspection and redelivery. The backlog
   left (entries not yet read) is in the report, and a warning is logged when it is over
   ``BACKLOG_WARNING``.

Roll-ups are one ``INSERT … ON CONFLICT DO UPDATE SET n = n + excluded.n`` per (use case,
tenant, model, minute) — the same SQL on SQLite and PostgreSQL. Malformed entries are
logged, acknowledged and skipped, so one bad record cannot wedge the stream.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from typing import Any, NamedTuple, cast

import valkey
from django.conf import settings
from django.db import connection, models, transaction

from gateway.accounting import (
    BACKLOG_WARNING,
    DECISIONS_STREAM,
    GUARDRAILS_STREAM,
    PERSISTER_GROUP,
    USAGE_STREAM,
)
from governance.audit import Actor, audit_record
from governance.models import Tenant, UseCase
from scheduler.findings import findings_store
from scheduler.models import AdmissionDecision, StreamCursor, UsageMinute

logger = logging.getLogger(__name__)

GROUP = PERSISTER_GROUP
KEEP_ACKNOWLEDGED_MS = 3_600_000
BATCH_SIZE = 1000
_MAX_BIGINT = 2**63 - 1

StreamEntry = tuple[bytes, dict[bytes, bytes]]

# The audit trail's record of refused requests: one event per group of a batch.
REFUSAL_ACTION = "admission.refused"
REFUSAL_ACTOR = Actor.system("usage-persister")
REFUSALS = (AdmissionDecision.Kind.REJECTED, AdmissionDecision.Kind.SHED)
REFUSAL_REQUEST_IDS = 20  # request ids listed in a summary; the rest are counted


@dataclass
class PersistReport:
    """What one ``usage_persist`` run did, per stream and in total."""

    usage: int = 0  # usage entries rolled up
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


@cache
def _client_for(url: str) -> valkey.Valkey:
    return valkey.Valkey.from_url(url, socket_timeout=10, socket_connect_timeout=5)


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
    client = client or _client_for(settings.VALKEY_URL)
    consumer = consumer or default_consumer()
    report = PersistReport()
    for stream in (USAGE_STREAM, DECISIONS_STREAM, GUARDRAILS_STREAM):
        _ensure_group(client, stream)
        for _ in range(max_batches):
            taken = _persist_batch(client, stream, consumer, batch_size, report)
            if taken is None:
                report.skipped_locked.append(stream)
                break
            if taken < batch_size:
                break
        report.trimmed += _trim_consumed(client, stream, keep_acknowledged_ms)
        report.unread[stream] = unread = _unread(client, stream)
        if unread >= BACKLOG_WARNING:
            logger.warning(
                "usage_persist_backlog stream=%s unread=%s (runs read at most %s a run)",
                stream,
                unread,
                batch_size * max_batches,
            )
    return report


def _next_id(entry_id: bytes | str) -> str:
    ms, seq = _parse_id(entry_id)
    return f"{ms}-{seq + 1}"


def _trim_consumed(client: valkey.Valkey, stream: str, keep_ms: int) -> int:
    """Trim the entries every consumer group has read and acknowledged, but those of the
    last ``keep_ms`` (entry ids are Valkey's clock); returns how many.

    The floor is the oldest entry any group still needs: its oldest pending one, or the one
    after its last delivered. No group: nothing is known to be read, nothing is trimmed.
    Entries delivered after the floor was read are above it, so a run reading meanwhile
    loses nothing."""
    groups = cast(list[dict[str, Any]], client.xinfo_groups(stream))
    if not groups:
        return 0
    seconds, microseconds = cast(tuple[int, int], client.time())
    floors = [f"{max(0, seconds * 1000 + microseconds // 1000 - keep_ms)}-0"]
    for group in groups:
        floor = _next_id(group["last-delivered-id"])
        if int(group["pending"]):
            oldest = cast(dict[str, Any], client.xpending(stream, group["name"]))["min"]
            # None: another persister acknowledged them meanwhile; the floor read before
            # stays (lower than what it is now, so nothing unread is trimmed).
            if oldest is not None:
                floor = min(floor, _text_id(oldest), key=_parse_id)
        floors.append(floor)
    return int(cast(int, client.xtrim(stream, minid=min(floors, key=_parse_id), approximate=False)))


def _text_id(entry_id: bytes | str) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


def _unread(client: valkey.Valkey, stream: str) -> int:
    """Entries not yet delivered to the persister's group (its lag; the stream's length
    when Valkey cannot count it)."""
    for group in cast(list[dict[str, Any]], client.xinfo_groups(stream)):
        if _text_id(group["name"]) == GROUP and group.get("lag") is not None:
            return int(group["lag"])
    return int(cast(int, client.xlen(stream)))


def _ensure_group(client: valkey.Valkey, stream: str) -> None:
    try:
        # From the stream's start: entries written before the first run count too.
        client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    except valkey.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _persist_batch(
    client: valkey.Valkey, stream: str, consumer: str, batch_size: int, report: PersistReport
) -> int | None:
    """One batch in one transaction; the number of entries taken, None if another run holds
    the stream."""
    StreamCursor.objects.get_or_create(stream=stream)
    with transaction.atomic():
        cursor = StreamCursor.objects.select_for_update(skip_locked=True).filter(stream=stream)
        locked = cursor.first()
        if locked is None:
            return None
        claimed = _claim_orphans(client, stream, consumer, batch_size)
        entries = list(claimed)
        if len(entries) < batch_size:
            entries += _read_new(client, stream, consumer, batch_size - len(entries))
        if not entries:
            return 0
        last = _parse_id(locked.last_id)
        fresh = [entry for entry in entries if _parse_id(entry[0]) > last]
        report.claimed += len(claimed)
        report.replayed += len(entries) - len(fresh)
        if fresh:
            if stream == USAGE_STREAM:
                report.usage += _roll_up(fresh, report)
            elif stream == GUARDRAILS_STREAM:
                report.findings += findings_store(fresh, report)
            else:
                report.decisions += _store_decisions(fresh, report)
            locked.last_id = max(fresh, key=lambda e: _parse_id(e[0]))[0].decode()
            locked.save(update_fields=["last_id", "updated_at"])
    # After COMMIT: dying before this line only makes the next run see them as replays.
    client.xack(stream, GROUP, *[entry_id for entry_id, _ in entries])
    return len(entries)


def _claim_orphans(
    client: valkey.Valkey, stream: str, consumer: str, count: int
) -> list[StreamEntry]:
    claimed: list[StreamEntry] = []
    start: bytes | str = "0-0"
    while len(claimed) < count:
        reply = cast(
            list[Any],
            client.xautoclaim(
                stream, GROUP, consumer, min_idle_time=0, start_id=start, count=count - len(claimed)
            ),
        )
        start, entries = reply[0], reply[1]
        # Entries trimmed away (MAXLEN) come back as None payloads: nothing to persist.
        claimed += [(entry_id, fields) for entry_id, fields in entries if fields is not None]
        if start in (b"0-0", "0-0"):
            break
    return claimed


def _read_new(client: valkey.Valkey, stream: str, consumer: str, count: int) -> list[StreamEntry]:
    reply = cast(list[Any], client.xreadgroup(GROUP, consumer, {stream: ">"}, count=count))
    if not reply:
        return []
    return [(entry_id, fields) for entry_id, fields in reply[0][1]]


def _parse_id(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


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


def _store_decisions(entries: Sequence[StreamEntry], report: PersistReport) -> int:
    rows = []
    tenant_of, tenant_of_slug = _tenants_of(entries)
    for entry_id, fields in entries:
        try:
            decision = _text(fields, "decision", 16)
            if decision not in AdmissionDecision.Kind.values:
                raise ValueError(decision)
            rows.append(
                AdmissionDecision(
                    stream_id=entry_id.decode(),
                    request_id=_text(fields, "request_id", 128),
                    occurred_at=_at(fields),
                    decision=decision,
                    reason=_text(fields, "reason", 200),
                    tenant=_text(fields, "tenant", 100),
                    tenant_id=tenant_of.get(
                        _int(fields, "use_case_id"),
                        tenant_of_slug.get(_text(fields, "tenant", 100)),
                    ),
                    use_case_id=_int(fields, "use_case_id"),
                    key_id=_number(fields, "key_id", optional=True),
                    model=_text(fields, "model", 200),
                    queued_ms=_int(fields, "wait_ms"),
                    policy_version=_number(fields, "policy_version", optional=True),
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


def _tenants_of(entries: Sequence[StreamEntry]) -> tuple[dict[int, int], dict[str, int]]:
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
