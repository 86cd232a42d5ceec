"""Checkpoints of the audit chain's head, signed with a key the database does not hold and
written outside it: a chain rewritten end to end (trigger dropped, every hash recomputed)
no longer matches them, and verification says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from governance.audit import Actor, audit_record, audit_verify, event_hash
from governance.models import AuditChainHead, AuditEvent

pytestmark = pytest.mark.django_db

ACTOR = Actor(username="olivia", request_id="req-1", source_ip="10.0.0.7")


def record(n: int) -> None:
    for i in range(n):
        audit_record(actor=ACTOR, action="tenant.update", before={"n": i}, after={"n": i + 1})


def checkpoint() -> None:
    """What beat runs periodically."""
    from governance.tasks import anchor_audit_chain

    anchor_audit_chain()


def rewrite_chain_consistently(sequence: int, actor: str) -> None:
    """What someone with database rights could do: drop the append-only trigger, change an
    event, and recompute every hash after it and the head, so the chain is self-consistent."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "ALTER TABLE governance_auditevent DISABLE TRIGGER audit_event_append_only"
            )
        else:
            cursor.execute("DROP TRIGGER audit_event_no_update")
        prev = None
        for event in AuditEvent.objects.order_by("sequence"):
            if event.sequence == sequence:
                event.actor = actor
            if prev is not None:
                event.prev_hash = prev
            event.hash = event_hash(event)
            prev = event.hash
            cursor.execute(
                "UPDATE governance_auditevent SET actor = %s, prev_hash = %s, hash = %s"
                " WHERE sequence = %s",
                [event.actor, event.prev_hash, event.hash, event.sequence],
            )
        if connection.vendor == "postgresql":
            cursor.execute(
                "ALTER TABLE governance_auditevent ENABLE TRIGGER audit_event_append_only"
            )
    AuditChainHead.objects.filter(id=1).update(last_hash=prev)


def test_a_checkpoint_is_signed_and_written_outside_the_database() -> None:
    record(3)
    checkpoint()
    files = sorted(Path(settings.AUDIT_ANCHOR_DIR).iterdir())
    assert len(files) == 1
    written = json.loads(files[0].read_text())
    assert written["sequence"] == 3
    assert written["hash"] == AuditEvent.objects.get(sequence=3).hash
    assert len(written["signature"]) == 64
    report = audit_verify()
    assert report.ok, report
    assert report.checkpoints_checked == 1


def test_a_chain_rewritten_consistently_fails_against_its_checkpoints(tmp_path) -> None:
    record(3)
    checkpoint()
    record(2)
    checkpoint()
    rewrite_chain_consistently(2, "mallory")

    # The rewrite is self-consistent: without checkpoints nothing would show it.
    with override_settings(AUDIT_ANCHOR_DIR=str(tmp_path / "none")):
        assert audit_verify().ok
    report = audit_verify()
    assert not report.ok
    assert report.first_broken_sequence == 3
    assert "checkpoint" in report.problem


def test_a_chain_cut_back_below_a_checkpoint_fails() -> None:
    record(4)
    checkpoint()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "ALTER TABLE governance_auditevent DISABLE TRIGGER audit_event_append_only"
            )
            cursor.execute("DELETE FROM governance_auditevent WHERE sequence = 4")
            cursor.execute(
                "ALTER TABLE governance_auditevent ENABLE TRIGGER audit_event_append_only"
            )
        else:
            cursor.execute("DROP TRIGGER audit_event_no_delete")
            cursor.execute("DELETE FROM governance_auditevent WHERE sequence = 4")
    AuditChainHead.objects.filter(id=1).update(
        last_sequence=3, last_hash=AuditEvent.objects.get(sequence=3).hash
    )
    report = audit_verify()
    assert not report.ok
    assert report.first_broken_sequence == 4
    assert "checkpoint" in report.problem


def test_a_checkpoint_not_signed_with_the_anchor_key_is_refused() -> None:
    record(2)
    with override_settings(AUDIT_ANCHOR_KEY="someone-elses-key-" + "y" * 20):
        checkpoint()
    report = audit_verify()
    assert not report.ok
    assert "signature" in report.problem


def test_the_verify_command_checks_the_checkpoints(capsys) -> None:
    record(3)
    checkpoint()
    call_command("audit_verify")
    assert "3 events verified, matching 1 signed checkpoint" in capsys.readouterr().out
    rewrite_chain_consistently(1, "mallory")
    with pytest.raises(SystemExit) as exit_info:
        call_command("audit_verify")
    assert exit_info.value.code == 1
    assert "checkpoint" in capsys.readouterr().err


def test_beat_writes_checkpoints_periodically() -> None:
    from config.celery import app

    entry = app.conf.beat_schedule["anchor-audit-chain"]
    assert entry["task"] == "governance.anchor_audit_chain"
    assert float(entry["schedule"]) > 0


def test_the_verify_endpoint_reports_the_checkpoints() -> None:
    from rest_framework.test import APIClient

    from governance.roles import Role
    from testkit.factories import make_user

    record(2)
    checkpoint()
    client = APIClient()
    client.force_authenticate(make_user("audrey", Role.AUDITOR))
    intact = client.get("/api/audit-events/verify/")
    assert intact.status_code == 200
    assert intact.json()["checkpoints_checked"] == 1
    rewrite_chain_consistently(2, "mallory")
    broken = client.get("/api/audit-events/verify/")
    assert broken.status_code == 409
    assert "checkpoint" in broken.json()["problem"]
