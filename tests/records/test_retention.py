"""Retention deletes old usage roll-ups and admission decisions, in bounded batches, and
never the audit trail."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from governance.audit import Actor, audit_record, audit_verify
from governance.models import AuditEvent
from records.models import AdmissionDecision, GuardrailFinding, GuardrailHour, UsageMinute
from records.usage_retention import retention_apply

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def usage_at(*ages_days: float) -> None:
    UsageMinute.objects.bulk_create(
        UsageMinute(
            use_case_id=7,
            tenant="acme",
            model="llama-test",
            minute=(NOW - timedelta(days=age)).replace(second=0, microsecond=0),
            requests=1,
        )
        for age in ages_days
    )


def decisions_at(*ages_days: float) -> None:
    AdmissionDecision.objects.bulk_create(
        AdmissionDecision(
            stream_id=f"{n}-0",
            request_id=f"r{n}-{age}",
            occurred_at=NOW - timedelta(days=age),
            decision="rejected",
            reason="queue_full",
            tenant="acme",
            use_case_id=7,
            model="llama-test",
        )
        for n, age in enumerate(ages_days)
    )


def ages(
    model: type[UsageMinute | AdmissionDecision | GuardrailFinding | GuardrailHour], field: str
) -> list[float]:
    return sorted(
        round((NOW - getattr(row, field)).total_seconds() / 86400, 2) for row in model.objects.all()
    )


def test_rows_past_retention_are_deleted_and_newer_ones_kept(caplog) -> None:
    caplog.set_level(logging.INFO, logger="records.usage_retention")
    usage_at(0, 1, 399, 400.5, 401, 800)
    decisions_at(0, 30, 89.9, 90.1, 91, 365)
    summary = audit_record(actor=Actor.system("tests"), action="admission.refused")

    report = retention_apply(now=NOW, usage_days=400, decision_days=90)

    assert (report.usage_minutes, report.admission_decisions) == (3, 3)
    assert ages(UsageMinute, "minute") == [0.0, 1.0, 399.0]
    assert ages(AdmissionDecision, "occurred_at") == [0.0, 30.0, 89.9]
    assert report.usage_cutoff == NOW - timedelta(days=400)
    assert report.decision_cutoff == NOW - timedelta(days=90)
    # The audit trail is never touched
    assert list(AuditEvent.objects.values_list("pk", flat=True)) == [summary.pk]
    assert audit_verify().ok
    assert "usage_minutes_deleted=3 admission_decisions_deleted=3" in caplog.text


def test_deletes_run_oldest_first_in_bounded_batches_and_the_next_run_carries_on() -> None:
    decisions_at(*(100 + n for n in range(7)))  # 7 expired rows
    AdmissionDecision.objects.bulk_create(
        AdmissionDecision(
            stream_id=f"recent-{n}",
            request_id=f"recent-{n}",
            occurred_at=NOW - timedelta(days=1),
            decision="shed",
            tenant="acme",
            use_case_id=7,
            model="llama-test",
        )
        for n in range(2)  # and 2 recent ones
    )

    with CaptureQueriesContext(connection) as queries:
        first = retention_apply(
            now=NOW, usage_days=0, decision_days=90, batch_size=3, max_batches=2
        )
    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]

    # Two batches of at most three rows each, the oldest first
    assert first.admission_decisions == 6
    assert len(deletes) == 2
    assert ages(AdmissionDecision, "occurred_at") == [1.0, 1.0, 100.0]

    second = retention_apply(now=NOW, usage_days=0, decision_days=90, batch_size=3)
    assert second.admission_decisions == 1
    assert ages(AdmissionDecision, "occurred_at") == [1.0, 1.0]


def test_zero_days_keeps_a_table_forever() -> None:
    usage_at(5000)
    decisions_at(5000)

    report = retention_apply(now=NOW, usage_days=0, decision_days=0)

    assert (report.usage_minutes, report.admission_decisions) == (0, 0)
    assert (report.usage_cutoff, report.decision_cutoff) == (None, None)
    assert UsageMinute.objects.count() == AdmissionDecision.objects.count() == 1


def test_the_beat_task_applies_the_configured_retention(settings) -> None:
    from config.celery import app
    from records.tasks import apply_retention

    settings.USAGE_RETENTION_DAYS = 400
    settings.DECISION_RETENTION_DAYS = 90
    now = datetime.now(tz=UTC)
    UsageMinute.objects.create(
        use_case_id=7, tenant="acme", model="m", minute=now - timedelta(days=401)
    )
    UsageMinute.objects.create(use_case_id=7, tenant="acme", model="m", minute=now)
    AdmissionDecision.objects.create(
        stream_id="1-0",
        request_id="old",
        occurred_at=now - timedelta(days=91),
        decision="rejected",
        tenant="acme",
        use_case_id=7,
        model="m",
    )

    result = apply_retention()  # in-process, as the worker's pool calls it

    assert (result["usage_minutes"], result["admission_decisions"]) == (1, 1)
    assert UsageMinute.objects.get().minute == now
    beat = app.conf.beat_schedule["apply-retention"]
    assert beat["task"] == "scheduler.apply_retention"


def settings_in_a_fresh_process(**env: str) -> tuple[str, str]:
    import subprocess
    import sys

    from ops.processes import REPO_ROOT

    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from django.conf import settings; "
            "print(settings.USAGE_RETENTION_DAYS, settings.DECISION_RETENTION_DAYS)",
        ],
        cwd=REPO_ROOT,
        env={"DJANGO_SETTINGS_MODULE": "config.settings", "PATH": "/usr/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.stdout.strip(), result.stderr


def test_the_retention_comes_from_the_environment_400_and_90_days_by_default() -> None:
    assert settings_in_a_fresh_process()[0] == "400 90"
    assert settings_in_a_fresh_process(SWITCHYARD_DECISION_RETENTION_DAYS="30")[0] == "400 30"
    out, err = settings_in_a_fresh_process(SWITCHYARD_USAGE_RETENTION_DAYS="-1")
    assert out == ""
    assert "SWITCHYARD_USAGE_RETENTION_DAYS=-1 must be at least 0" in err


def test_guardrail_findings_follow_the_decisions_age_and_their_hours_the_usage_age() -> None:
    """GIVEN findings and hourly counts of several ages WHEN retention runs THEN per-request
    findings older than the decisions' age and counts older than the usage age are gone."""
    GuardrailFinding.objects.bulk_create(
        GuardrailFinding(
            stream_id=f"{n}-0",
            request_id=f"r{n}",
            occurred_at=NOW - timedelta(days=age),
            tenant="acme",
            use_case_id=7,
            model="llama-test",
            stage="request",
            guardrail="pii",
            action="redacted",
            entities={"PERSON": 1},
        )
        for n, age in enumerate((1, 89, 91, 200))
    )
    GuardrailHour.objects.bulk_create(
        GuardrailHour(
            use_case_id=7,
            tenant="acme",
            guardrail="pii",
            action="redacted",
            hour=(NOW - timedelta(days=age)).replace(minute=0),
            findings=3,
        )
        for age in (1, 200, 401)
    )

    report = retention_apply(now=NOW, usage_days=400, decision_days=90)

    assert (report.guardrail_findings, report.guardrail_hours) == (2, 1)
    assert ages(GuardrailFinding, "occurred_at") == [1.0, 89.0]
    assert ages(GuardrailHour, "hour") == [1.0, 200.0]
    assert report.as_dict()["guardrail_findings"] == 2
