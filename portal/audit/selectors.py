"""Reads for the audit trail page: the last verification, a person's own audited activity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from governance.models import AuditEvent

VERIFIED = "audit.verified"
VIEWED = "audit.viewed"
# What an auditor does that leaves a trace: reading the trail, verifying it, downloading it,
# reading and exporting records, downloading files. Listed back to them on the page.
OWN_ACTIVITY_ACTIONS = (
    VIEWED,
    VERIFIED,
    "audit.exported",
    "records.viewed",
    "records.exported",
    "file.download",
)
OWN_ACTIVITY_ROWS = 10


@dataclass(frozen=True)
class Verification:
    """A verification run from the portal, as its own audit event recorded it."""

    event: AuditEvent
    ok: bool
    events_checked: int
    first_broken_sequence: int | None
    problem: str
    checkpoints_checked: int

    @classmethod
    def from_event(cls, event: AuditEvent) -> Verification:
        after: dict[str, Any] = event.after or {}
        broken = after.get("first_broken_sequence")
        return cls(
            event=event,
            ok=bool(after.get("ok")),
            events_checked=int(after.get("events_checked") or 0),
            first_broken_sequence=int(broken) if broken is not None else None,
            problem=str(after.get("problem") or ""),
            checkpoints_checked=int(after.get("checkpoints_checked") or 0),
        )


def last_verification() -> Verification | None:
    event = AuditEvent.objects.filter(action=VERIFIED).order_by("-sequence").first()
    return Verification.from_event(event) if event is not None else None


def own_activity(username: str) -> QuerySet[AuditEvent]:
    """The person's latest audited reads and downloads, newest first."""
    return AuditEvent.objects.filter(actor=username, action__in=OWN_ACTIVITY_ACTIONS).order_by(
        "-sequence"
    )[:OWN_ACTIVITY_ROWS]
