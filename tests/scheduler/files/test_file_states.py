"""A file registration's states: only the allowed steps, each once, each audited; the expiry
sweep takes only what was never uploaded in time, and runs as a real Celery task.

alice develops for acme (she registered the files); bob develops for globex; olivia is an
officer.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied

from governance.audit import Actor, audit_verify
from governance.choices import FileState
from governance.errors import Conflict
from governance.models import AuditEvent, FileRegistration
from governance.roles import Role
from ops.processes import ManagedProcess, wait_until
from runtime.valkey_urls import for_kombu
from scheduler.files.registration import file_cancel
from scheduler.files.states import (
    TRANSITIONS,
    file_cancelled,
    file_done,
    file_expire,
    file_failed,
    file_progress,
    file_queued,
    file_started,
    file_uploaded,
    files_expire,
)
from testkit.factories import make_model, make_tenant, make_use_case, make_user

NOW = datetime(2026, 11, 24, 9, 0, tzinfo=UTC)
PLATFORM = Actor.system("tests")
ARRIVED: dict[str, Any] = {
    "uploaded_at": NOW,
    "source_object": "uploads/acme/transcribe/1/call.wav",
    "source_bytes": 1000,
    "source_sha256": "ab" * 32,
}


@pytest.fixture
def use_case() -> Any:
    return make_use_case(make_tenant("acme"), "transcribe")


def _register(use_case: Any, **fields: Any) -> FileRegistration:
    values: dict[str, Any] = {
        "use_case": use_case,
        "registered_by": "alice",
        "kind": "audio",
        "filename": "call.wav",
        "model": fields.pop("model", None)
        or make_model(f"whisper-{FileRegistration.objects.count()}"),
        "declared_bytes": 1000,
        "declared_seconds": 60.0,
        "estimated_tokens": 600,
        "promised_by": NOW + timedelta(minutes=5),
        **fields,
    }
    return FileRegistration.objects.create(**values)


@pytest.mark.django_db
def test_the_happy_path_is_audited_step_by_step(use_case) -> None:
    registration = _register(use_case)
    file_uploaded(actor=PLATFORM, registration=registration, now=NOW, **ARRIVED)
    file_queued(actor=PLATFORM, registration=registration, now=NOW)
    file_started(actor=PLATFORM, registration=registration, now=NOW)
    file_progress(registration=registration, progress=0.5)
    done = file_done(
        actor=PLATFORM,
        registration=registration,
        outputs={"transcript": "acme/transcribe/1/transcript.json"},
        now=NOW + timedelta(minutes=2),
    )
    assert done.state == FileState.DONE
    assert done.progress == 1.0
    assert done.outputs == {"transcript": "acme/transcribe/1/transcript.json"}
    assert done.state_changed_at == NOW + timedelta(minutes=2)
    steps = list(
        AuditEvent.objects.filter(object_id=str(registration.pk))
        .order_by("sequence")
        .values_list("action", flat=True)
    )
    assert steps == [
        "fileregistration.uploaded",
        "fileregistration.queued",
        "fileregistration.running",
        "fileregistration.done",
    ]
    assert AuditEvent.objects.filter(tenant_slug="acme").count() == 4
    assert audit_verify().ok


def _at(use_case: Any, state: str) -> FileRegistration:
    registration = _register(use_case)
    FileRegistration.objects.filter(pk=registration.pk).update(state=state)
    registration.refresh_from_db()
    return registration


STEPS: dict[str, Callable[[FileRegistration], FileRegistration]] = {
    FileState.UPLOADED: lambda r: file_uploaded(actor=PLATFORM, registration=r, **ARRIVED),
    FileState.QUEUED: lambda r: file_queued(actor=PLATFORM, registration=r),
    FileState.RUNNING: lambda r: file_started(actor=PLATFORM, registration=r),
    FileState.DONE: lambda r: file_done(actor=PLATFORM, registration=r, outputs={}),
    FileState.FAILED: lambda r: file_failed(actor=PLATFORM, registration=r, failure="bad"),
    FileState.EXPIRED: lambda r: file_expire(actor=PLATFORM, registration=r),
    FileState.CANCELLED: lambda r: file_cancelled(actor=PLATFORM, registration=r),
}


@pytest.mark.django_db
@pytest.mark.parametrize("start", FileState.values)
@pytest.mark.parametrize("to", sorted(STEPS))
def test_every_step_not_in_the_table_is_refused(use_case, start: str, to: str) -> None:
    """GIVEN a registration in ``start`` WHEN any step is asked THEN the table decides; a
    refused step leaves the row and the audit trail untouched."""
    registration = _at(use_case, start)
    allowed = to in TRANSITIONS.get(start, frozenset())
    if allowed:
        assert STEPS[to](registration).state == to
        assert AuditEvent.objects.filter(action=f"fileregistration.{to}").count() == 1
    else:
        with pytest.raises(Conflict):
            STEPS[to](registration)
        registration.refresh_from_db()
        assert registration.state == start
        assert not AuditEvent.objects.filter(object_id=str(registration.pk)).exists()


def test_final_states_allow_nothing() -> None:
    for final in (FileState.DONE, FileState.FAILED, FileState.EXPIRED, FileState.CANCELLED):
        assert final not in TRANSITIONS


@pytest.mark.django_db
def test_a_stale_copy_loses_the_race_and_is_not_audited_twice(use_case) -> None:
    """Two workers read the same registered row; only the first upload event moves it."""
    first = _register(use_case)
    second = FileRegistration.objects.get(pk=first.pk)
    file_uploaded(actor=PLATFORM, registration=first, **ARRIVED)
    file_queued(actor=PLATFORM, registration=first)
    with pytest.raises(Conflict, match="changed state meanwhile"):
        file_uploaded(actor=PLATFORM, registration=second, **ARRIVED)
    assert AuditEvent.objects.filter(action="fileregistration.uploaded").count() == 1


@pytest.mark.django_db
def test_progress_only_moves_forward_and_only_while_running(use_case) -> None:
    registration = _at(use_case, FileState.RUNNING)
    assert file_progress(registration=registration, progress=0.6).progress == 0.6
    assert file_progress(registration=registration, progress=0.4).progress == 0.6
    queued = _at(use_case, FileState.QUEUED)
    assert file_progress(registration=queued, progress=0.3).progress == 0.0
    with pytest.raises(ValueError, match="between 0 and 1"):
        file_progress(registration=registration, progress=1.5)


@pytest.mark.django_db
def test_a_failure_says_why(use_case) -> None:
    registration = _at(use_case, FileState.RUNNING)
    failed = file_failed(actor=PLATFORM, registration=registration, failure="unreadable audio")
    assert failed.failure == "unreadable audio"
    event = AuditEvent.objects.get(action="fileregistration.failed")
    assert event.after == {"state": "failed", "failure": "unreadable audio"}
    with pytest.raises(ValueError, match="say why"):
        file_failed(actor=PLATFORM, registration=_at(use_case, FileState.RUNNING), failure=" ")


@pytest.mark.django_db
def test_the_tenants_developer_cancels_and_another_tenants_may_not(
    use_case, live_valkey_settings
) -> None:
    """Through scheduler.files.registration.file_cancel, the one door that checks who may
    cancel (and releases the promise, here none: the registration was made directly)."""
    alice = make_user("alice", Role.DEVELOPER, tenants=(use_case.tenant,))
    bob = make_user("bob", Role.DEVELOPER, tenants=(make_tenant("globex"),))
    registration = _register(use_case)
    with pytest.raises(PermissionDenied):
        file_cancel(actor=Actor.for_user(bob), file=registration)
    cancelled = file_cancel(actor=Actor.for_user(alice), file=registration, reason="wrong file")
    assert cancelled.state == FileState.CANCELLED
    event = AuditEvent.objects.get(action="fileregistration.cancelled")
    assert event.actor == "alice"
    assert event.after is not None
    assert event.after["reason"] == "wrong file"


# --- the expiry sweep -----------------------------------------------------------------------
@pytest.mark.django_db
def test_the_sweep_expires_only_what_was_never_uploaded_in_time(use_case) -> None:
    late = _register(use_case, promised_by=NOW - timedelta(seconds=1))
    past_deadline = _register(
        use_case, deadline=NOW - timedelta(minutes=1), promised_by=NOW + timedelta(hours=1)
    )
    # A deadline still ahead wins over an estimate already behind: the promise to the team
    # is the deadline they asked for.
    deadline_ahead = _register(
        use_case, deadline=NOW + timedelta(hours=1), promised_by=NOW - timedelta(minutes=1)
    )
    in_time = _register(use_case, promised_by=NOW + timedelta(minutes=1))
    uploaded_late = _at(use_case, FileState.UPLOADED)
    FileRegistration.objects.filter(pk=uploaded_late.pk).update(
        promised_by=NOW - timedelta(hours=1)
    )

    assert files_expire(now=NOW) == 2
    states = dict(FileRegistration.objects.values_list("pk", "state"))
    assert states[late.pk] == states[past_deadline.pk] == FileState.EXPIRED
    assert states[deadline_ahead.pk] == states[in_time.pk] == FileState.REGISTERED
    assert states[uploaded_late.pk] == FileState.UPLOADED
    expired = AuditEvent.objects.filter(action="fileregistration.expired")
    assert {e.actor for e in expired} == {"system:file-expiry"}
    assert files_expire(now=NOW) == 0  # idempotent: nothing left to take


@pytest.mark.django_db
def test_the_sweep_is_bounded_per_run_oldest_promise_first(use_case) -> None:
    model = make_model("whisper")
    rows = [
        _register(use_case, model=model, promised_by=NOW - timedelta(minutes=n))
        for n in range(1, 6)
    ]
    assert files_expire(now=NOW, batch=2) == 2
    expired = set(
        FileRegistration.objects.filter(state=FileState.EXPIRED).values_list("pk", flat=True)
    )
    assert expired == {rows[4].pk, rows[3].pk}
    assert files_expire(now=NOW, batch=10) == 3


@pytest.mark.django_db(transaction=True)  # the worker's connection sees committed rows only
def test_the_beat_task_expires_through_a_real_worker(
    use_case, valkey_url: str, celery_worker: ManagedProcess
) -> None:
    from config.celery import app
    from scheduler.files.tasks import expire_file_registrations

    overdue = _register(use_case, promised_by=datetime.now(UTC) - timedelta(minutes=1))
    app.conf.update(broker_url=for_kombu(valkey_url), result_backend=for_kombu(valkey_url))
    expire_file_registrations.delay()

    def expired() -> bool:
        return FileRegistration.objects.get(pk=overdue.pk).state == FileState.EXPIRED

    assert wait_until(expired, timeout=30), celery_worker.log_tail()
    assert AuditEvent.objects.filter(action="fileregistration.expired").count() == 1
    beat = app.conf.beat_schedule["expire-file-registrations"]
    assert beat["task"] == "governance.expire_file_registrations"
