"""A file registration's life, and the one way each step is taken.

    registered → uploaded → queued → running → done
                    └──────────┴─────────┴───→ failed
    any state before an end ─────────────────→ expired | cancelled

Each step is a conditional ``UPDATE … WHERE state = <the state read>``, so two workers (or a
worker and the expiry sweep) racing for one registration cannot both move it: the loser gets
``Conflict`` and the audit chain holds exactly one event per step. The S3 upload event, the
pipeline workers and the batch API call these; none of them sets ``state`` itself.

A move to an end sends ``file_ended`` once the transaction commits; the state machine does not
know who listens (the webhook sender, scheduler/files/webhooks.py, connected at start-up).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.dispatch import Signal
from django.utils import timezone

from governance.audit import Actor, audit_record
from governance.choices import FileState
from governance.errors import Conflict
from governance.models import FileRegistration


@dataclass(frozen=True)
class FileEnded:
    """What listeners to ``file_ended`` are told: which registration ended, how, and the
    use case's webhook URL at that moment ("" for none)."""

    registration_id: int
    state: str
    webhook_url: str


#: Sent on commit of every move to an end state, with ``ended=FileEnded(...)``.
file_ended = Signal()

FINAL_STATES = frozenset({FileState.DONE, FileState.FAILED, FileState.EXPIRED, FileState.CANCELLED})

# state → the states it may move to
TRANSITIONS: Mapping[str, frozenset[str]] = {
    FileState.REGISTERED: frozenset({FileState.UPLOADED, FileState.EXPIRED, FileState.CANCELLED}),
    # A pipeline can fail before it runs (an upload its decoder cannot read).
    FileState.UPLOADED: frozenset(
        {FileState.QUEUED, FileState.FAILED, FileState.EXPIRED, FileState.CANCELLED}
    ),
    FileState.QUEUED: frozenset(
        {FileState.RUNNING, FileState.FAILED, FileState.EXPIRED, FileState.CANCELLED}
    ),
    FileState.RUNNING: frozenset(
        {FileState.DONE, FileState.FAILED, FileState.EXPIRED, FileState.CANCELLED}
    ),
}

EXPIRE_BATCH = 500  # per sweep: a backlog of stale registrations drains over several runs
MAX_FAILURE_CHARS = 4000


def can_move(current: str, to: str) -> bool:
    return to in TRANSITIONS.get(current, frozenset())


def _move(
    *,
    actor: Actor,
    registration: FileRegistration,
    to: str,
    now: datetime | None = None,
    reason: str = "",
    **fields: Any,
) -> FileRegistration:
    current = registration.state
    if not can_move(current, to):
        raise Conflict(f"A {current} file cannot become {to}.")
    now = now or timezone.now()
    with transaction.atomic():
        moved = FileRegistration.objects.filter(pk=registration.pk, state=current).update(
            state=to, state_changed_at=now, updated_at=now, **fields
        )
        if not moved:
            registration.refresh_from_db(fields=["state"])
            raise Conflict(
                f"The file changed state meanwhile (now {registration.state}); not {to}."
            )
        before = {"state": current}
        after: dict[str, Any] = {"state": to, **fields}
        if reason:
            after["reason"] = reason
        audit_record(
            actor=actor,
            action=f"fileregistration.{to}",
            obj=registration,
            before=before,
            after=after,
            tenant_slug=registration.use_case.tenant.slug,
            object_repr=f"{registration.use_case}: {registration.filename}",
        )
        if to in FINAL_STATES:
            ended = FileEnded(registration.pk, to, registration.use_case.webhook_url)
            transaction.on_commit(lambda: file_ended.send(sender=FileRegistration, ended=ended))
    registration.refresh_from_db()
    return registration


def file_uploaded(
    *,
    actor: Actor,
    registration: FileRegistration,
    uploaded_at: datetime,
    source_object: str,
    source_bytes: int,
    source_sha256: str = "",
    now: datetime | None = None,
) -> FileRegistration:
    """The object arrived (the upload event): where it is, its size and digest, and when —
    the moment a turnaround is counted from."""
    if not source_object:
        raise ValueError("name the uploaded object")
    if source_bytes < 0:
        raise ValueError("an object's size is not negative")
    return _move(
        actor=actor,
        registration=registration,
        to=FileState.UPLOADED,
        now=now,
        uploaded_at=uploaded_at,
        source_object=source_object,
        source_bytes=source_bytes,
        source_sha256=source_sha256,
    )


def file_queued(
    *,
    actor: Actor,
    registration: FileRegistration,
    promised_by: datetime | None = None,
    now: datetime | None = None,
) -> FileRegistration:
    """The upload was matched and its job handed to the scheduler; ``promised_by`` is the
    deadline re-promised from the upload (a turnaround restarts when the file arrives)."""
    fields: dict[str, Any] = {} if promised_by is None else {"promised_by": promised_by}
    return _move(actor=actor, registration=registration, to=FileState.QUEUED, now=now, **fields)


def file_started(
    *, actor: Actor, registration: FileRegistration, now: datetime | None = None
) -> FileRegistration:
    return _move(
        actor=actor, registration=registration, to=FileState.RUNNING, now=now, progress=0.0
    )


def file_progress(*, registration: FileRegistration, progress: float) -> FileRegistration:
    """Record how far a running job is, for the portal's bar. Not audited: a long file reports
    once per part, and the audit chain records the steps, not the ticks. Never goes back (parts
    finish out of order) and never moves a file that is no longer running."""
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"progress {progress} is not between 0 and 1")
    FileRegistration.objects.filter(
        Q(progress__lt=progress), pk=registration.pk, state=FileState.RUNNING
    ).update(progress=progress, updated_at=timezone.now())
    registration.refresh_from_db(fields=["progress", "state", "updated_at"])
    return registration


def file_done(
    *,
    actor: Actor,
    registration: FileRegistration,
    outputs: Mapping[str, str],
    counts: Mapping[str, int] | None = None,
    now: datetime | None = None,
) -> FileRegistration:
    """The job finished; ``outputs`` names its objects (transcript, chunks, summary…) and
    ``counts`` tallies what it did (audio seconds, pages, batch lines)."""
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in outputs.items()):
        raise ValueError("outputs maps names to object names (strings)")
    fields: dict[str, Any] = {"progress": 1.0, "outputs": dict(outputs)}
    if counts is not None:
        if not all(isinstance(k, str) and isinstance(v, int) for k, v in counts.items()):
            raise ValueError("counts maps names to integers")
        fields["counts"] = {**registration.counts, **counts}
    return _move(actor=actor, registration=registration, to=FileState.DONE, now=now, **fields)


def file_failed(
    *,
    actor: Actor,
    registration: FileRegistration,
    failure: str,
    now: datetime | None = None,
) -> FileRegistration:
    """The job cannot finish; ``failure`` is what the team is shown (no secrets, no content)."""
    if not failure.strip():
        raise ValueError("say why the file failed")
    return _move(
        actor=actor,
        registration=registration,
        to=FileState.FAILED,
        now=now,
        failure=failure[:MAX_FAILURE_CHARS],
    )


def file_cancelled(
    *, actor: Actor, registration: FileRegistration, reason: str = "", now: datetime | None = None
) -> FileRegistration:
    """The move to ``cancelled``. Who may cancel (a key of the use case, its tenant's
    developers, officers) is checked by ``scheduler.files.registration.file_cancel``, which also
    releases the registration's promise: call that, not this, on a person's or a client's
    behalf."""
    return _move(
        actor=actor,
        registration=registration,
        to=FileState.CANCELLED,
        now=now,
        reason=reason[:300],
    )


def file_expire(
    *, actor: Actor, registration: FileRegistration, now: datetime | None = None
) -> FileRegistration:
    return _move(actor=actor, registration=registration, to=FileState.EXPIRED, now=now)


def files_overdue(now: datetime) -> Q:
    """Registrations never uploaded by their deadline, or, without one, by the completion time
    promised: no job could still keep that promise, so holding the slot helps nobody."""
    return Q(state=FileState.REGISTERED) & (
        Q(deadline__lte=now) | Q(deadline__isnull=True, promised_by__lte=now)
    )


def files_expire(*, now: datetime, batch: int = EXPIRE_BATCH) -> int:
    """Expire up to ``batch`` overdue registrations, oldest promise first; how many it did.
    One that is uploaded while the sweep runs stays uploaded (its conditional update wins)."""
    actor = Actor.system("file-expiry")
    expired = 0
    overdue = (
        FileRegistration.objects.filter(files_overdue(now))
        .select_related("use_case__tenant")
        .order_by("promised_by", "pk")[:batch]
    )
    for registration in overdue:
        try:
            file_expire(actor=actor, registration=registration, now=now)
        except Conflict:
            continue
        expired += 1
    return expired
