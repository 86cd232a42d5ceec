"""The upload consumer: match each upload event to its registration and queue its job.

Beat runs ``uploads_consume`` every ``SWITCHYARD_FILE_UPLOADS_POLL_SECONDS`` (2): one
non-blocking ``XREADGROUP`` on ``sy:uploads`` (group ``file-jobs``), after an ``XAUTOCLAIM`` of
entries a dead consumer left pending longer than ``CLAIM_IDLE_MS``. A beat task, not a
long-poll loop: it needs no process of its own, a worker that dies loses nothing (its entries
are claimed by the next run), and the latency (a couple of seconds) is nothing beside any
SLA's turnaround.

For each event, in order: ``file_uploaded`` with what arrived; the **re-promise** (a class's
turnaround is counted from the upload, so the deadline becomes ``uploaded_at + turnaround``
and the promise in the model's ledger is replaced under the same job id); ``file_queued``. The
entry is acknowledged once that is done, so a crash between the steps is finished by the
redelivery (an ``uploaded`` registration is queued; a ``queued`` one only acknowledged).

A re-promise that no longer fits (the file came late and the fleet is busier than at
registration) does not refuse the file: it was accepted and has arrived. The job is kept and
queued with the SLA's deadline, its entry is written into the ledger anyway (so later
registrations count its work), and the registration is recorded **at risk**: an audit event
``file.at_risk`` with the deadline and the earliest completion the model could promise.
Earliest-deadline-first still runs it before anything due later.

Events for an unknown registration, one that has ended (cancelled, expired…) or a duplicate
are acknowledged and logged; nothing an event holds can crash the consumer.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import valkey

from governance.audit import Actor, audit_record
from governance.choices import FileState
from governance.errors import Conflict
from governance.models import FileRegistration
from governance.sla_windows import WindowError, parse_windows
from governance.store import valkey_client
from scheduler.files import feasibility
from scheduler.files.feasibility import Job
from scheduler.files.registration import capacity_settings
from scheduler.files.states import file_queued, file_uploaded
from scheduler.files.upload_events import UPLOADS_GROUP, UPLOADS_STREAM, UploadEvent

logger = logging.getLogger(__name__)

ACTOR = Actor.system("file-uploads")
CLAIM_IDLE_MS = 60_000  # a consumer that held an entry this long without acking is dead
BATCH = 100


@dataclass
class ConsumeReport:
    queued: int = 0
    acked_only: int = 0
    at_risk: int = 0
    claimed: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "queued": self.queued,
            "acked_only": self.acked_only,
            "at_risk": self.at_risk,
            "claimed": self.claimed,
            "errors": self.errors,
        }


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def ensure_group(client: valkey.Valkey) -> None:
    try:
        client.xgroup_create(UPLOADS_STREAM, UPLOADS_GROUP, id="0", mkstream=True)
    except valkey.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def uploads_consume(
    *, client: valkey.Valkey | None = None, consumer: str | None = None, batch: int = BATCH
) -> ConsumeReport:
    """One pass over the stream: dead consumers' entries first, then new ones."""
    client = client or valkey_client()
    consumer = consumer or consumer_name()
    ensure_group(client)
    report = ConsumeReport()
    claimed = cast(
        list[Any],
        client.xautoclaim(
            UPLOADS_STREAM, UPLOADS_GROUP, consumer, min_idle_time=CLAIM_IDLE_MS, count=batch
        ),
    )
    entries: list[tuple[bytes, dict[bytes, bytes]]] = list(claimed[1]) if claimed else []
    report.claimed = len(entries)
    fresh = cast(
        list[Any],
        client.xreadgroup(UPLOADS_GROUP, consumer, {UPLOADS_STREAM: ">"}, count=batch),
    )
    for _stream, items in fresh or []:
        entries.extend(items)
    for entry_id, fields in entries:
        if fields:  # a claimed entry trimmed from the stream meanwhile has no fields
            try:
                outcome = upload_handle(UploadEvent.parse(fields), client=client)
            except (KeyError, ValueError, UnicodeDecodeError) as exc:
                logger.warning("upload_event_malformed id=%s error=%s", entry_id, exc)
                outcome = "acked"
            except Exception as exc:
                logger.exception("upload_event_failed id=%s", entry_id)
                report.errors.append(f"{entry_id!r}: {type(exc).__name__}")
                continue
            if outcome == "queued":
                report.queued += 1
            elif outcome == "at_risk":
                report.queued += 1
                report.at_risk += 1
            else:
                report.acked_only += 1
        client.xack(UPLOADS_STREAM, UPLOADS_GROUP, entry_id)
    return report


def upload_handle(event: UploadEvent, *, client: valkey.Valkey) -> str:
    """Move the event's registration to ``queued``; "queued", "at_risk" or "acked"."""
    registration = (
        FileRegistration.objects.select_related("use_case__tenant", "sla_class", "model")
        .filter(pk=event.registration_id)
        .first()
    )
    if registration is None:
        logger.warning("upload_event_unknown registration=%s", event.registration_id)
        return "acked"
    try:
        if registration.state == FileState.REGISTERED:
            registration = file_uploaded(
                actor=ACTOR,
                registration=registration,
                uploaded_at=datetime.fromtimestamp(event.uploaded_at, UTC),
                source_object=event.object_name,
                source_bytes=event.size,
                source_sha256=event.sha256,
            )
        elif registration.state != FileState.UPLOADED:
            logger.info(
                "upload_event_ignored registration=%s state=%s",
                registration.pk,
                registration.state,
            )
            return "acked"
        deadline, at_risk = repromise(registration, client=client)
        file_queued(actor=ACTOR, registration=registration, promised_by=deadline)
    except Conflict as exc:  # another consumer (or a cancel) moved it first
        logger.info("upload_event_raced registration=%s why=%s", registration.pk, exc)
        return "acked"
    return "at_risk" if at_risk else "queued"


def repromise(
    registration: FileRegistration, *, client: valkey.Valkey
) -> tuple[datetime | None, bool]:
    """Restart a turnaround at the upload: (the new deadline or None if unchanged, at risk).

    Only classes with ``turnaround_seconds`` restart; "by the end of the next window" and an
    explicit deadline keep what was promised."""
    sla_class = registration.sla_class
    if sla_class is None or sla_class.turnaround_seconds is None or not registration.uploaded_at:
        return None, False
    start = registration.uploaded_at
    if registration.not_before is not None and registration.not_before > start:
        start = registration.not_before
    deadline = start + timedelta(seconds=sla_class.turnaround_seconds)
    try:
        windows = parse_windows(sla_class.windows)
    except WindowError:
        windows = ()

    def reintervals(until: float) -> tuple[feasibility.Interval, ...]:
        return feasibility.job_intervals(
            windows, sla_class.time_zone, start=start, end=datetime.fromtimestamp(until, UTC)
        )

    job = Job(
        id=str(registration.pk),
        tokens=float(registration.estimated_tokens),
        deadline=deadline.timestamp(),
        intervals=reintervals(deadline.timestamp()),
    )
    model = registration.model.public_id
    now = datetime.now(UTC).timestamp()
    answer = feasibility.promise(
        client, model, job, capacity_settings(), now=now, reintervals=reintervals
    )
    if answer.feasible:
        return deadline, False
    feasibility.record(client, model, job)
    audit_record(
        actor=ACTOR,
        action="file.at_risk",
        obj=registration,
        after={
            "promised_by": deadline.isoformat(),
            "earliest_possible": (
                answer.earliest_possible.isoformat() if answer.earliest_possible else None
            ),
            "rate_tokens_per_second": answer.rate,
        },
        tenant_slug=registration.use_case.tenant.slug,
        tenant_id=registration.use_case.tenant_id,
    )
    logger.warning(
        "file_at_risk registration=%s promised_by=%s earliest=%s",
        registration.pk,
        deadline.isoformat(),
        answer.earliest_possible,
    )
    return deadline, True
