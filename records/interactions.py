"""Persist ``sy:records`` — the transcripts of ``full`` use cases — into sealed objects in
object storage, and their rows into the database.

Exactly-once effects as for usage (``records.streams``: one persister per stream under a
row lock, orphans first, a committed-id cursor). Per batch:

1. Entries are grouped by (use case, hour of ``at_ms`` UTC) and each group becomes one
   object (``records.objects``), named after the group's first and last entry
   ids, and written to storage **before** any row is written. (The batch holds the
   stream's cursor lock meanwhile, as every persister batch does, so that no other run
   claims its entries: on PostgreSQL that is one row; on SQLite, whose transactions take
   the write lock up front, other writers wait for the object writes — tens of
   milliseconds for a batch of ``BATCH_SIZE``.) A batch of orphans is never topped up with
   new entries, so a batch that died is retried as the same entries, the same groups, and
   overwrites the same objects: a crash leaves no second copy.
2. Then, in the batch's transaction: the ``RecordObject`` rows, the ``InteractionRecord``
   upserts (content, object, line, checksum; the metadata too, for rows the usage
   persister has not created yet), one ``records.object_stored`` audit event per object
   (its checksums, which ``records_verify`` later holds the object to), the cursor.
3. XACK after COMMIT; then the acknowledged entries are trimmed after ``KEEP_ACKNOWLEDGED_MS``
   (a minute: content must not linger in Valkey), never an unread or unacknowledged one.

A storage failure raises before COMMIT: nothing is committed, nothing acknowledged, and the
entries stay pending for the next run (beat runs it every few seconds). An entry whose row
already has its content stored (redelivered) is acknowledged only. A malformed entry is
logged, acknowledged and skipped.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import valkey
from django.conf import settings

from gateway.accounting import BACKLOG_WARNING, RECORDS_STREAM
from governance.audit import Actor, audit_record, event_hash
from governance.models import AuditEvent
from records.models import InteractionRecord, RecordObject
from records.objects import (
    EncodedObject,
    ObjectUnreadable,
    TranscriptLine,
    Verification,
    decode_object,
    encode_object,
    object_key,
    read_object,
    text_field,
    verify_sealed,
    write_object,
)
from records.sealing import sealed_key_id
from records.streams import (
    StreamEntry,
    client_for,
    ensure_group,
    stream_batch,
    text_id,
    trim_consumed,
    unread,
)
from records.usage import default_consumer, record_metadata, tenant_for, tenants_of

logger = logging.getLogger(__name__)

BATCH_SIZE = 500  # entries of about 2 KB each: a batch is about 1 MB of content
KEEP_ACKNOWLEDGED_MS = 60_000
STORED_ACTION = "records.object_stored"
RESEALED_ACTION = "records.object_resealed"  # records/rewrap.py: same content, new seal
MAX_RESEALS = 100  # links followed back from a re-seal's event to where the object was stored
ACTOR = Actor.system("records-persister")
# The columns a records entry owns on a row the usage persister may have created first.
CONTENT_FIELDS = ("content", "object", "line", "content_sha256", "truncated")


class StorageUnavailable(Exception):
    """An object could not be written: the batch is left pending for the next run."""


@dataclass
class RecordsReport:
    """What one ``records_persist`` run did."""

    stored: int = 0  # transcripts written into objects and committed
    objects: int = 0  # objects written
    replayed: int = 0  # entries already committed, only acknowledged
    duplicates: int = 0  # entries whose record already had its content stored
    claimed: int = 0  # entries taken over from a consumer that died
    malformed: int = 0
    skipped_locked: bool = False
    trimmed: int = 0
    unread: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "stored": self.stored,
            "objects": self.objects,
            "replayed": self.replayed,
            "duplicates": self.duplicates,
            "claimed": self.claimed,
            "malformed": self.malformed,
            "skipped_locked": self.skipped_locked,
            "trimmed": self.trimmed,
            "unread": self.unread,
        }


def records_persist(
    *,
    client: valkey.Valkey | None = None,
    consumer: str | None = None,
    batch_size: int = BATCH_SIZE,
    max_batches: int = 20,
    keep_acknowledged_ms: int = KEEP_ACKNOWLEDGED_MS,
) -> RecordsReport:
    """Drain ``sy:records`` into objects and rows, up to ``max_batches`` batches, then trim
    what was acknowledged more than ``keep_acknowledged_ms`` ago."""
    if batch_size < 1 or max_batches < 1:
        raise ValueError("batch_size and max_batches must be at least 1")
    client = client or client_for(settings.VALKEY_URL)
    consumer = consumer or default_consumer()
    report = RecordsReport()
    ensure_group(client, RECORDS_STREAM)
    for _ in range(max_batches):
        taken = stream_batch(
            client,
            RECORDS_STREAM,
            consumer,
            batch_size,
            report,
            lambda fresh: _store(fresh, report),
            top_up=False,
        )
        if taken is None:
            report.skipped_locked = True
            break
        if taken == 0:
            break
    report.trimmed = trim_consumed(client, RECORDS_STREAM, keep_acknowledged_ms)
    report.unread = unread(client, RECORDS_STREAM)
    if report.unread >= BACKLOG_WARNING:
        logger.warning("records_persist_backlog stream=%s unread=%s", RECORDS_STREAM, report.unread)
    if report.stored or report.malformed or report.duplicates:  # quiet when idle (every 5 s)
        logger.info(
            "records_persisted %s", " ".join(f"{k}={v}" for k, v in report.as_dict().items())
        )
    return report


@dataclass
class _Transcript:
    entry_id: str
    row: InteractionRecord  # metadata, from the entry
    line: TranscriptLine


@dataclass
class _Group:
    use_case_id: int
    tenant_id: int | None
    tenant: str
    hour: datetime
    transcripts: list[_Transcript] = field(default_factory=list)


def _store(entries: Sequence[StreamEntry], report: RecordsReport) -> None:
    """Inside the batch's transaction: write the objects, then their rows and audit events."""
    transcripts = _parse(entries, report)
    already = set(
        InteractionRecord.objects.filter(
            record_id__in=[t.row.record_id for t in transcripts],
            content=InteractionRecord.Content.STORED,
        ).values_list("record_id", flat=True)
    )
    report.duplicates += sum(1 for t in transcripts if t.row.record_id in already)
    groups = _group([t for t in transcripts if t.row.record_id not in already])
    written: list[tuple[_Group, str, EncodedObject]] = []
    for group in groups:
        first, last = group.transcripts[0].entry_id, group.transcripts[-1].entry_id
        key = object_key(
            tenant_id=group.tenant_id,
            use_case_id=group.use_case_id,
            hour=group.hour,
            first=first,
            last=last,
        )
        if RecordObject.objects.filter(key=key).exists():
            # Committed already (a cursor reset): rewriting it would change the bytes its
            # audit event vouches for.
            report.duplicates += len(group.transcripts)
            continue
        encoded = encode_object([t.line for t in group.transcripts])
        try:
            write_object(key, encoded)
        except Exception as exc:  # botocore / OS errors: the whole batch waits
            raise StorageUnavailable(f"object {key} could not be written: {exc}") from exc
        written.append((group, key, encoded))
    for group, key, encoded in written:
        _commit_object(group, key, encoded)
        report.objects += 1
        report.stored += len(group.transcripts)


def _parse(entries: Sequence[StreamEntry], report: RecordsReport) -> list[_Transcript]:
    tenant_of, tenant_of_slug = tenants_of(entries)
    parsed: dict[str, _Transcript] = {}
    for entry_id, fields in entries:
        try:
            row = record_metadata(
                fields, tenant_for(fields, tenant_of, tenant_of_slug), policy="full"
            )
            line = _line(row, fields)
        except (ValueError, OverflowError) as exc:
            report.malformed += 1
            logger.warning(
                "records_entry_malformed stream=%s id=%s why=%s", RECORDS_STREAM, entry_id, exc
            )
            continue
        # The same record twice in one batch (the gateway retried its write): keep the first.
        parsed.setdefault(row.record_id, _Transcript(text_id(entry_id), row, line))
    return list(parsed.values())


def _line(row: InteractionRecord, fields: Mapping[bytes, bytes]) -> TranscriptLine:
    request, request_encoding = text_field(fields.get(b"request", b""))
    response, response_encoding = text_field(fields.get(b"response", b""))
    return {
        "record_id": row.record_id,
        "request_id": row.request_id,
        "at_ms": round(float(fields[b"at_ms"])),  # parsed once already by record_metadata
        "tenant": row.tenant,
        "use_case_id": row.use_case_id,
        "key_id": row.key_id,
        "model": row.model,
        "endpoint": row.endpoint,
        "status": row.status,
        "streamed": row.streamed,
        "request": request,
        "request_encoding": request_encoding,
        "response": response,
        "response_encoding": response_encoding,
        "response_type": fields.get(b"response_type", b"").decode(errors="replace")[:200],
        "truncated": fields.get(b"truncated", b"") in (b"1", b"true", b"True"),
    }


def _group(transcripts: Sequence[_Transcript]) -> list[_Group]:
    """One group per use case × hour, in entry order within each."""
    groups: dict[tuple[int, datetime], _Group] = {}
    for transcript in transcripts:
        row = transcript.row
        hour = row.occurred_at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        group = groups.setdefault(
            (row.use_case_id, hour), _Group(row.use_case_id, row.tenant_id, row.tenant, hour)
        )
        group.transcripts.append(transcript)
    return [groups[key] for key in sorted(groups)]


def _commit_object(group: _Group, key: str, encoded: EncodedObject) -> None:
    obj = RecordObject.objects.create(
        key=key,
        use_case_id=group.use_case_id,
        tenant_id=group.tenant_id,
        hour=group.hour,
        records=len(group.transcripts),
        size=len(encoded.sealed),
        sha256=encoded.sha256,
        sealed_sha256=encoded.sealed_sha256,
        key_id=encoded.key_id,
    )
    rows = []
    for index, transcript in enumerate(group.transcripts):
        row = transcript.row
        row.content = InteractionRecord.Content.STORED
        row.object = obj
        row.line = index
        row.content_sha256 = encoded.line_sha256[index]
        row.truncated = transcript.line["truncated"]
        rows.append(row)
    # New rows get everything; rows the usage persister created keep their metadata fresh
    # and gain the content. A records entry is self-contained, so the metadata agree.
    InteractionRecord.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["record_id"],
        update_fields=list(CONTENT_FIELDS),
    )
    event = audit_record(
        actor=ACTOR,
        action=STORED_ACTION,
        obj=obj,
        object_repr=f"{len(rows)} transcripts in {key}"[:200],
        tenant_slug=group.tenant[:63],
        tenant_id=group.tenant_id,
        after=stored_detail(obj),
    )
    obj.audit_sequence = event.sequence
    obj.save(update_fields=["audit_sequence"])


def stored_detail(obj: RecordObject) -> dict[str, Any]:
    """What the audit event of a stored object records, and verification compares."""
    return {
        "key": obj.key,
        "sha256": obj.sha256,
        "sealed_sha256": obj.sealed_sha256,
        "records": obj.records,
        "key_id": obj.key_id,
    }


def _audit_problem(obj: RecordObject) -> str:
    """Why the audit trail does not vouch for the object's row ("" when it does): the row's
    event is this object's and records the row as it is. A re-seal's event (a key rotation)
    names, in ``before``, the row as it was and its event: each link back to the event that
    stored the object must hold the same content checksum and line count, so a re-seal can
    change the seal and the key, never what the object says."""
    sequence, expected = obj.audit_sequence, stored_detail(obj)
    for _ in range(MAX_RESEALS):
        if sequence is None:
            return "no audit event recorded its checksums"
        event = AuditEvent.objects.filter(sequence=sequence).first()
        if event is None:
            return f"audit event {sequence} is missing"
        if event.hash != event_hash(event):
            return f"audit event {event.sequence} does not match its hash"
        if event.action not in (STORED_ACTION, RESEALED_ACTION) or (
            event.object_type,
            event.object_id,
        ) != (RecordObject._meta.label_lower, str(obj.pk)):
            return f"audit event {event.sequence} is not this object's"
        if event.after != expected:
            return f"the object's row differs from what audit event {event.sequence} recorded"
        if event.action == STORED_ACTION:
            return ""
        before = event.before if isinstance(event.before, dict) else {}
        if [before.get(name) for name in ("sha256", "records")] != [
            expected["sha256"],
            expected["records"],
        ]:
            return f"audit event {event.sequence} re-sealed other content"
        sequence, expected = before.get("audit_sequence"), {k: before.get(k) for k in expected}
    return f"more than {MAX_RESEALS} re-seals"


def records_verify(obj: RecordObject, *, stored: bytes | None = None) -> Verification:
    """Whether an object is the one that was recorded: its stored bytes against the row's
    checksums, the row against the audit event written when it was stored (and that event
    against its own hash), the seal, and each record's line against its checksum. A changed
    object fails on its checksum; one swapped for another genuine object fails on the row's;
    a row edited to match fails on the audit event."""
    problem = _audit_problem(obj)
    if problem:
        return Verification(False, problem)
    try:
        sealed = read_object(obj.key) if stored is None else stored
    except ObjectUnreadable as exc:
        return Verification(False, str(exc))
    verdict = verify_sealed(sealed, sha256=obj.sha256, sealed_sha256=obj.sealed_sha256)
    if not verdict.ok:
        return verdict
    if len(sealed) != obj.size:
        return Verification(False, f"{len(sealed)} bytes stored, {obj.size} recorded")
    if sealed_key_id(sealed) != obj.key_id:  # it opened, so its header parses
        return Verification(False, "sealed with another key than recorded")
    lines = decode_object(sealed)
    if len(lines) != obj.records:
        return Verification(False, f"{len(lines)} lines, {obj.records} recorded")
    for record_id, line, line_sha256 in obj.lines.values_list(
        "record_id", "line", "content_sha256"
    ):
        if line is None or line >= len(lines):
            return Verification(False, f"record {record_id} points at no line")
        if hashlib.sha256(lines[line]).hexdigest() != line_sha256:
            return Verification(False, f"record {record_id}'s line differs from its checksum")
    return Verification(True)
