"""Reading file registrations for people: which they may see, their parts, their history.

Officers, auditors and admins see every tenant's files; developers their own tenants'
(``use_cases_visible``). A file outside that set is treated as absent (404), never "forbidden",
so its existence does not leak across tenants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q, QuerySet, Sum

from governance.choices import FileState
from governance.models import AuditEvent, FileRegistration
from governance.roles import AnyUser, Role, can_govern, has_role
from governance.selectors import use_cases_visible
from scheduler.files.states import FINAL_STATES
from scheduler.models import FilePart, PartState

HISTORY_ACTIONS = ("file.register", "file.cancel")


@dataclass(frozen=True, slots=True)
class PartsSummary:
    total: int
    done: int
    running: int
    failed: int
    pending: int
    tokens: int


def files_visible(user: AnyUser) -> QuerySet[FileRegistration]:
    return FileRegistration.objects.filter(use_case__in=use_cases_visible(user)).select_related(
        "use_case__tenant", "model", "sla_class"
    )


def with_parts_counts(files: QuerySet[FileRegistration]) -> QuerySet[FileRegistration]:
    """Each row with its parts' tallies (``parts_total``, ``parts_done``…), for lists: one
    query for the page instead of one per row."""
    return files.annotate(
        parts_total=Count("parts"),
        parts_done=Count("parts", filter=Q(parts__state=PartState.DONE)),
        parts_running=Count("parts", filter=Q(parts__state=PartState.RUNNING)),
        parts_failed=Count("parts", filter=Q(parts__state=PartState.FAILED)),
    )


def file_find(user: AnyUser, pk: int) -> FileRegistration:
    """Raises FileRegistration.DoesNotExist for a file the user may not see."""
    return files_visible(user).get(pk=pk)


def is_final(file: FileRegistration) -> bool:
    return file.state in FINAL_STATES


def may_cancel(user: AnyUser, file: FileRegistration) -> bool:
    """Mirrors scheduler.files.registration.file_cancel's rule, to show the button only to
    those it obeys."""
    if is_final(file) or not user.is_authenticated:
        return False
    if can_govern(user):
        return True
    return (
        has_role(user, Role.DEVELOPER) and file.use_case.tenant.members.filter(pk=user.pk).exists()
    )


def parts_summary(file: FileRegistration) -> PartsSummary:
    annotated: Any = file
    if hasattr(annotated, "parts_total"):  # annotated by with_parts_counts
        total, done = int(annotated.parts_total), int(annotated.parts_done)
        running, failed = int(annotated.parts_running), int(annotated.parts_failed)
        return PartsSummary(total, done, running, failed, total - done - running - failed, 0)
    found = FilePart.objects.filter(registration=file).aggregate(
        total=Count("pk"),
        done=Count("pk", filter=Q(state=PartState.DONE)),
        running=Count("pk", filter=Q(state=PartState.RUNNING)),
        failed=Count("pk", filter=Q(state=PartState.FAILED)),
        tokens=Sum("tokens"),
    )
    total = int(found["total"])
    done, running, failed = int(found["done"]), int(found["running"]), int(found["failed"])
    return PartsSummary(
        total=total,
        done=done,
        running=running,
        failed=failed,
        pending=total - done - running - failed,
        tokens=int(found["tokens"] or 0),
    )


def file_parts(file: FileRegistration) -> QuerySet[FilePart]:
    return FilePart.objects.filter(registration=file).order_by("index")


def file_history(file: FileRegistration) -> QuerySet[AuditEvent]:
    """The registration's steps as the audit trail holds them, oldest first (downloads are
    listed on the audit trail page, not here: they are reads, not steps)."""
    return AuditEvent.objects.filter(
        Q(action__startswith="fileregistration.") | Q(action__in=HISTORY_ACTIONS),
        object_type=FileRegistration._meta.label_lower,
        object_id=str(file.pk),
    ).order_by("sequence")


def state_choices() -> list[tuple[str, str]]:
    return list(FileState.choices)
