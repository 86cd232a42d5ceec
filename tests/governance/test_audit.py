"""The audit trail is append-only and its hash chain shows any tampering, and where."""

from __future__ import annotations

import threading

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from governance.audit import GENESIS_HASH, Actor, audit_record, audit_verify
from governance.models import AuditEvent

pytestmark = pytest.mark.django_db

ACTOR = Actor(username="olivia", request_id="req-1", source_ip="10.0.0.7")


def record(n: int) -> list[AuditEvent]:
    return [
        audit_record(actor=ACTOR, action="tenant.update", before={"n": i}, after={"n": i + 1})
        for i in range(n)
    ]


def test_events_chain_each_to_the_one_before() -> None:
    first, second, third = record(3)
    assert first.prev_hash == GENESIS_HASH
    assert second.prev_hash == first.hash
    assert third.prev_hash == second.hash
    assert [e.sequence for e in (first, second, third)] == [1, 2, 3]
    assert first.actor == "olivia"
    assert first.request_id == "req-1"
    assert first.source_ip == "10.0.0.7"
    assert audit_verify().ok
    assert audit_verify().events_checked == 3


def test_the_orm_refuses_to_change_or_delete_an_event() -> None:
    (event,) = record(1)
    event.action = "nothing.happened"
    with pytest.raises(ValidationError, match="append-only"):
        event.save()
    with pytest.raises(ValidationError, match="append-only"):
        event.delete()


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE governance_auditevent SET actor = 'mallory' WHERE sequence = 2",
        "DELETE FROM governance_auditevent WHERE sequence = 2",
    ],
)
def test_the_database_itself_refuses_to_rewrite_history(sql: str) -> None:
    record(3)
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql)
    assert audit_verify().ok


def _tamper(sql: str) -> None:
    """Rewrite history the way only someone who first dropped the triggers could."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "ALTER TABLE governance_auditevent DISABLE TRIGGER audit_event_append_only"
            )
            cursor.execute(sql)
            cursor.execute(
                "ALTER TABLE governance_auditevent ENABLE TRIGGER audit_event_append_only"
            )
        else:
            cursor.execute("DROP TRIGGER audit_event_no_update")
            cursor.execute("DROP TRIGGER audit_event_no_delete")
            cursor.execute(sql)


@pytest.mark.parametrize(
    ("sql", "broken", "problem"),
    [
        ("UPDATE governance_auditevent SET actor = 'mallory' WHERE sequence = 3", 3, "content"),
        ("DELETE FROM governance_auditevent WHERE sequence = 3", 3, "missing"),
        ("DELETE FROM governance_auditevent WHERE sequence = 5", 5, "head says"),
        (
            "UPDATE governance_auditevent SET prev_hash = '" + "f" * 64 + "' WHERE sequence = 4",
            4,
            "link",
        ),
        ("DELETE FROM governance_auditchainhead", 1, "head record is missing"),
    ],
    ids=["edited", "removed-middle", "removed-last", "relinked", "head-removed"],
)
def test_verification_reports_the_first_broken_link(sql: str, broken: int, problem: str) -> None:
    record(5)
    _tamper(sql)
    report = audit_verify()
    assert not report.ok
    assert report.first_broken_sequence == broken
    assert problem in report.problem


def test_the_verify_command_exits_non_zero_on_a_broken_chain(capsys) -> None:
    record(3)
    call_command("audit_verify")
    assert "3 events" in capsys.readouterr().out
    _tamper("UPDATE governance_auditevent SET after = '{\"n\": 99}' WHERE sequence = 2")
    with pytest.raises(SystemExit) as exit_info:
        call_command("audit_verify")
    assert exit_info.value.code == 1
    assert "#2" in capsys.readouterr().err


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_form_one_unbroken_chain() -> None:
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(5):
                audit_record(actor=ACTOR, action="usecase.update")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=write) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    report = audit_verify()
    assert report.ok, report
    assert report.events_checked == 20
