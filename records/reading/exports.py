"""Exports of a selection of records as JSON Lines or CSV, streamed and audited."""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Generator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from django.conf import settings
from django.db.models import QuerySet

from governance.audit import Actor, audit_record
from governance.models import Tenant, UseCase
from records.models import RECORD_METADATA_FIELDS, InteractionRecord
from records.objects import ObjectCache, ObjectUnreadable
from records.reading.transcripts import content_read

EXPORT_FORMATS = ("jsonl", "csv")
# Rows fetched per database round trip while exporting, and rows per chunk handed to the
# web server: a few hundred keeps memory flat and the number of thread hops small.
EXPORT_FETCH_ROWS = 500
EXPORT_CHUNK_ROWS = 200
# Decoded objects kept while exporting (newest first interleaves a few use cases' objects).
EXPORT_CACHED_OBJECTS = 32


class ExportRefused(Exception):
    """An export that will not start (too many records, an unknown format)."""


EXPORT_COLUMNS = ("record_id", *RECORD_METADATA_FIELDS, "content", "content_sha256", "truncated")
CONTENT_COLUMNS = (
    "request",
    "request_encoding",
    "response",
    "response_encoding",
    "response_type",
    "content_error",
)


def export_limit() -> int:
    return int(settings.RECORDS_EXPORT_MAX_RECORDS)


def export_check(*, rows: QuerySet[InteractionRecord], fmt: str) -> int:
    """How many records an export would hold; ``ExportRefused`` beyond the limit."""
    if fmt not in EXPORT_FORMATS:
        raise ExportRefused(f"Choose a format: {', '.join(EXPORT_FORMATS)}.")
    count = rows.count()
    limit = export_limit()
    if count > limit:
        raise ExportRefused(
            f"This selection holds {count:,} records; an export holds at most {limit:,}. "
            "Narrow the search (a shorter time range, one use case)."
        )
    return count


def _export_row(record: InteractionRecord, cache: ObjectCache) -> dict[str, Any]:
    row: dict[str, Any] = {name: getattr(record, name) for name in EXPORT_COLUMNS}
    row["occurred_at"] = record.occurred_at.astimezone(UTC).isoformat()
    if record.content == InteractionRecord.Content.STORED:
        try:
            line = content_read(record, cache)
        except ObjectUnreadable as exc:
            row["content_error"] = f"cannot be verified: {exc}"
        else:
            for name in CONTENT_COLUMNS[:-1]:
                row[name] = line.get(name, "")
    return row


@dataclass
class ExportResult:
    """What an export wrote so far: its audit event says this, complete or cut short."""

    records: int = 0
    digest: Any = field(default_factory=hashlib.sha256)
    complete: bool = False

    @property
    def sha256(self) -> str:
        return str(self.digest.hexdigest())


def records_export(
    *,
    actor: Actor,
    rows: QuerySet[InteractionRecord],
    fmt: str,
    described: dict[str, Any],
    expected: int,
) -> Generator[bytes]:
    """The export's bytes, a few hundred records per chunk, read with a database cursor and
    the object cache (memory stays flat).

    Audited twice. Now, before a byte is sent: one ``records.export_started`` event records
    who, the filter, the format and how many records the selection holds (``expected``, what
    ``export_check`` counted). When the stream ends — finished, or closed early because the
    client went away, even before its first chunk — one ``records.exported`` event records
    how many records were sent and the SHA-256 of what was sent, naming the start's event."""
    tenant_slug, tenant_id = _tenant_of(described)
    started = audit_record(
        actor=actor,
        action="records.export_started",
        object_repr=f"{expected} records as {fmt}",
        after={"filter": described, "format": fmt, "records": expected},
        tenant_slug=tenant_slug,
        tenant_id=tenant_id,
    )
    chunks = _export_chunks(
        actor=actor,
        rows=rows,
        fmt=fmt,
        described=described,
        started=started.sequence,
        tenant=(tenant_slug, tenant_id),
    )
    # Step into its ``try`` now: a generator closed before it ever ran skips its ``finally``,
    # and an export the client dropped before the first chunk would then have no end.
    next(chunks)
    return chunks


def _tenant_of(described: dict[str, Any]) -> tuple[str, int | None]:
    """The tenant an export is confined to by its filter (its tenant, or its use case's);
    ("", None) for an export across tenants."""
    if described.get("tenant"):
        slug = str(described["tenant"])
        return slug, Tenant.objects.filter(slug=slug).values_list("pk", flat=True).first()
    if described.get("use_case") is not None:
        use_case = UseCase.objects.select_related("tenant").filter(pk=described["use_case"])
        found = use_case.first()
        if found is not None:
            return found.tenant.slug, found.tenant_id
    return "", None


def _export_chunks(
    *,
    actor: Actor,
    rows: QuerySet[InteractionRecord],
    fmt: str,
    described: dict[str, Any],
    started: int,
    tenant: tuple[str, int | None],
) -> Generator[bytes]:
    """An empty chunk first (``records_export`` steps past it), then the export's bytes."""
    result = ExportResult()
    cache = ObjectCache(size=EXPORT_CACHED_OBJECTS)
    try:
        yield b""
        buffer = io.StringIO()
        writer = csv.DictWriter(
            buffer, fieldnames=[*EXPORT_COLUMNS, *CONTENT_COLUMNS], extrasaction="ignore"
        )
        if fmt == "csv":
            writer.writeheader()
        pending: list[bytes] = [buffer.getvalue().encode()] if fmt == "csv" else []
        in_chunk = 0
        records = rows.select_related("object").iterator(chunk_size=EXPORT_FETCH_ROWS)
        for record in records:
            row = _export_row(record, cache)
            if fmt == "csv":
                buffer.seek(0)
                buffer.truncate()
                writer.writerow(row)
                pending.append(buffer.getvalue().encode())
            else:
                pending.append(orjson.dumps(row) + b"\n")
            in_chunk += 1
            if in_chunk >= EXPORT_CHUNK_ROWS:
                chunk = b"".join(pending)
                pending, in_chunk = [], 0
                result.digest.update(chunk)
                result.records += EXPORT_CHUNK_ROWS
                yield chunk
        chunk = b"".join(pending)
        if chunk:
            result.digest.update(chunk)
            result.records += in_chunk
            yield chunk
        result.complete = True
    finally:
        audit_record(
            actor=actor,
            action="records.exported",
            object_repr=f"{result.records} records as {fmt}",
            after={
                "filter": described,
                "format": fmt,
                "records": result.records,
                "sha256": result.sha256,
                "complete": result.complete,
                "started": started,
            },
            tenant_slug=tenant[0],
            tenant_id=tenant[1],
        )


def export_filename(fmt: str, moment: datetime | None = None) -> str:
    moment = moment or datetime.now(UTC)
    return f"switchyard-records-{moment:%Y%m%dT%H%M%SZ}.{fmt}"


def export_content_type(fmt: str) -> str:
    return "text/csv; charset=utf-8" if fmt == "csv" else "application/jsonl"
