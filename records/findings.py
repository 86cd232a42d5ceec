"""Guardrail findings from ``sy:guardrails`` into the database: one row per finding and an
hourly count per use case × guardrail × action.

Called by the usage persister (``records.usage``) inside its batch transaction, so the same
lock, cursor and XACK make it exactly-once. Rows carry entity types and counts as the gateway
recorded them — never the text a detector matched. A malformed entry is counted, logged and
skipped, like the other streams'. Each row carries the request's ``record_id`` (empty for
entries from before interaction records), which ties it to its ``InteractionRecord``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson
from django.db import connection, models

from gateway.accounting import GUARDRAILS_STREAM
from governance.models import UseCase
from records.models import GuardrailFinding, GuardrailHour

logger = logging.getLogger(__name__)

StreamEntry = tuple[bytes, dict[bytes, bytes]]
_MAX_BIGINT = 2**63 - 1
_MAX_ENTITIES = 50  # entity types kept per finding; detectors report a bounded vocabulary


class Counts(Protocol):
    malformed: int


def _text(fields: Mapping[bytes, bytes], name: str, max_length: int) -> str:
    return fields.get(name.encode(), b"").decode(errors="replace")[:max_length]


def _int(fields: Mapping[bytes, bytes], name: str, *, optional: bool = False) -> int | None:
    raw = fields.get(name.encode(), b"")
    if raw == b"" and optional:
        return None
    return max(-_MAX_BIGINT, min(_MAX_BIGINT, round(float(raw))))


def _entities(raw: bytes) -> dict[str, int]:
    """``{"EMAIL_ADDRESS": 2}``: entity type → count, checked, since it is shown to people."""
    value: Any = orjson.loads(raw or b"{}")
    if not isinstance(value, dict) or len(value) > _MAX_ENTITIES:
        raise ValueError("entities is not an object of at most 50 entity types")
    counts: dict[str, int] = {}
    for name, count in value.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"entity count for {name!r} is not a count")
        counts[str(name)[:100]] = count
    return counts


def _finding(entry_id: bytes, fields: Mapping[bytes, bytes]) -> GuardrailFinding:
    action = _text(fields, "action", 16)
    if action not in GuardrailFinding.Action.values:
        raise ValueError(f"action {action!r}")
    stage = _text(fields, "stage", 8)
    if stage not in GuardrailFinding.Stage.values:
        raise ValueError(f"stage {stage!r}")
    guardrail = _text(fields, "guardrail", 64)
    if not guardrail:
        raise ValueError("no guardrail")
    score_raw = fields.get(b"score", b"")
    at_ms = _int(fields, "at_ms")
    use_case_id = _int(fields, "use_case_id")
    assert at_ms is not None
    assert use_case_id is not None
    return GuardrailFinding(
        stream_id=entry_id.decode(),
        request_id=_text(fields, "request_id", 128),
        record_id=_text(fields, "record_id", 40),
        occurred_at=datetime.fromtimestamp(at_ms / 1000, tz=UTC),
        tenant=_text(fields, "tenant", 100),
        use_case_id=use_case_id,
        key_id=_int(fields, "key_id", optional=True),
        model=_text(fields, "model", 200),
        stage=stage,
        guardrail=guardrail,
        action=action,
        entities=_entities(fields.get(b"entities", b"")),
        score=float(score_raw) if score_raw else None,
        policy_version=_int(fields, "policy_version", optional=True),
    )


def findings_store(entries: Sequence[StreamEntry], report: Counts) -> int:
    """Store the batch's findings and add them to the hourly counts; how many were stored."""
    rows: list[GuardrailFinding] = []
    for entry_id, fields in entries:
        try:
            rows.append(_finding(entry_id, fields))
        except (ValueError, OverflowError, orjson.JSONDecodeError) as exc:
            report.malformed += 1
            logger.warning(
                "guardrail_entry_malformed stream=%s id=%s why=%s", GUARDRAILS_STREAM, entry_id, exc
            )
    tenants = dict(
        UseCase.objects.filter(pk__in={row.use_case_id for row in rows}).values_list(
            "pk", "tenant_id"
        )
    )
    for row in rows:
        row.tenant_id = tenants.get(row.use_case_id)
    # Only rows new to the table count towards the hours: a replay is a no-op twice over.
    known = set(
        GuardrailFinding.objects.filter(stream_id__in=[r.stream_id for r in rows]).values_list(
            "stream_id", flat=True
        )
    )
    fresh = [row for row in rows if row.stream_id not in known]
    GuardrailFinding.objects.bulk_create(fresh, ignore_conflicts=True)
    _hours_add(fresh)
    return len(fresh)


HourKey = tuple[int, str, str, datetime]


def _column(name: str) -> str:
    field = GuardrailHour._meta.get_field(name)
    assert isinstance(field, models.Field)
    return field.column


def _hours_add(rows: Sequence[GuardrailFinding]) -> None:
    sums: dict[HourKey, list[Any]] = {}
    for row in rows:
        hour = row.occurred_at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        key = (row.use_case_id, row.guardrail, row.action, hour)
        sums.setdefault(key, [row.tenant_id, row.tenant, 0])[2] += 1
    if not sums:
        return
    quote = connection.ops.quote_name
    table = quote(GuardrailHour._meta.db_table)
    names = ("use_case_id", "guardrail", "action", "hour", "tenant_id", "tenant", "findings")
    columns = [quote(_column(name)) for name in names]
    findings = columns[-1]
    sql = (
        f"INSERT INTO {table} ({', '.join(columns)}) "  # noqa: S608 (names from the model)
        f"VALUES ({', '.join(['%s'] * len(columns))}) "
        f"ON CONFLICT ({', '.join(columns[:4])}) DO UPDATE SET "
        f"{findings} = {table}.{findings} + excluded.{findings}"
    )
    with connection.cursor() as cursor:
        cursor.executemany(
            sql,
            [
                (
                    use_case_id,
                    guardrail,
                    action,
                    connection.ops.adapt_datetimefield_value(hour),
                    tenant_id,
                    tenant,
                    count,
                )
                for (use_case_id, guardrail, action, hour), (
                    tenant_id,
                    tenant,
                    count,
                ) in sums.items()
            ],
        )
