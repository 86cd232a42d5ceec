"""Retention: delete usage roll-ups and admission decisions older than their configured age.

Guardrail findings follow the same two ages: per-request rows (``GuardrailFinding``) the
decisions' (``DECISION_RETENTION_DAYS``), their hourly counts (``GuardrailHour``) the usage
roll-ups' (``USAGE_RETENTION_DAYS``), so the counts outlive the detail as usage does.

Deletes run oldest first in bounded batches, one short transaction each, so a large backlog
(the first run after enabling retention) never holds a long lock or a huge transaction; a
run stops after ``max_batches`` per table and the next run carries on. The audit trail is
never touched: its rows, including the refusal summaries, are append-only for good.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from records.models import AdmissionDecision, GuardrailFinding, GuardrailHour, UsageMinute

logger = logging.getLogger(__name__)

BATCH_SIZE = 5000
MAX_BATCHES = 100


@dataclass
class RetentionReport:
    usage_minutes: int = 0  # UsageMinute rows deleted
    admission_decisions: int = 0  # AdmissionDecision rows deleted
    guardrail_findings: int = 0  # GuardrailFinding rows deleted (decision retention)
    guardrail_hours: int = 0  # GuardrailHour rows deleted (usage retention)
    usage_cutoff: datetime | None = None  # None: that table is kept forever
    decision_cutoff: datetime | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "usage_minutes": self.usage_minutes,
            "admission_decisions": self.admission_decisions,
            "guardrail_findings": self.guardrail_findings,
            "guardrail_hours": self.guardrail_hours,
            "usage_cutoff": self.usage_cutoff.isoformat() if self.usage_cutoff else None,
            "decision_cutoff": self.decision_cutoff.isoformat() if self.decision_cutoff else None,
        }


def _cutoff(now: datetime, days: int) -> datetime | None:
    return now - timedelta(days=days) if days > 0 else None


def retention_apply(
    *,
    now: datetime | None = None,
    usage_days: int | None = None,
    decision_days: int | None = None,
    batch_size: int = BATCH_SIZE,
    max_batches: int = MAX_BATCHES,
) -> RetentionReport:
    """Delete rows past retention (``0`` days keeps a table forever); counts what it did."""
    now = now or timezone.now()
    usage_days = settings.USAGE_RETENTION_DAYS if usage_days is None else usage_days
    decision_days = settings.DECISION_RETENTION_DAYS if decision_days is None else decision_days
    report = RetentionReport(
        usage_cutoff=_cutoff(now, usage_days), decision_cutoff=_cutoff(now, decision_days)
    )
    if report.usage_cutoff is not None:
        report.usage_minutes = _delete_before(
            UsageMinute, "minute", report.usage_cutoff, batch_size, max_batches
        )
        report.guardrail_hours = _delete_before(
            GuardrailHour, "hour", report.usage_cutoff, batch_size, max_batches
        )
    if report.decision_cutoff is not None:
        report.admission_decisions = _delete_before(
            AdmissionDecision, "occurred_at", report.decision_cutoff, batch_size, max_batches
        )
        report.guardrail_findings = _delete_before(
            GuardrailFinding, "occurred_at", report.decision_cutoff, batch_size, max_batches
        )
    logger.info(
        "retention_applied usage_minutes_deleted=%d admission_decisions_deleted=%d "
        "guardrail_findings_deleted=%d guardrail_hours_deleted=%d "
        "usage_cutoff=%s decision_cutoff=%s",
        report.usage_minutes,
        report.admission_decisions,
        report.guardrail_findings,
        report.guardrail_hours,
        report.usage_cutoff.isoformat() if report.usage_cutoff else "never",
        report.decision_cutoff.isoformat() if report.decision_cutoff else "never",
    )
    return report


def _delete_before(
    model: type[models.Model], field: str, cutoff: datetime, batch_size: int, max_batches: int
) -> int:
    expired = model._default_manager.filter(**{f"{field}__lt": cutoff}).order_by(field)
    deleted = 0
    for _ in range(max_batches):
        with transaction.atomic():
            ids = list(expired.values_list("pk", flat=True)[:batch_size])
            if not ids:
                break
            count, _ = model._default_manager.filter(pk__in=ids).delete()
        deleted += count
        logger.debug("retention_batch table=%s deleted=%d", model._meta.db_table, count)
        if len(ids) < batch_size:
            break
    else:
        logger.info(
            "retention_backlog table=%s deleted=%d the next run carries on",
            model._meta.db_table,
            deleted,
        )
    return deleted
