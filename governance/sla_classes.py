"""SLA classes: a use case's promises for file work, set by officers.

Every door (API, admin, policy as code, the demo seed) writes through these services, so a
class that reaches the feasibility model is one it can reason about: windows that parse, a
time zone that exists, a turnaround it can measure against or windows whose end it can name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from governance.audit import Actor
from governance.choices import SLA_CLASS_FIELDS, SLA_MIN_TURNAROUND_SECONDS, FileKind
from governance.errors import Conflict
from governance.models import PriorityClass, SlaClass, UseCase
from governance.services.authority import require_governor
from governance.services.generic_records import record_create, record_delete, record_update
from governance.sla_windows import WindowError, parse_windows, zone

MIN_TURNAROUND_SECONDS = SLA_MIN_TURNAROUND_SECONDS
EDITABLE_FIELDS = frozenset(SLA_CLASS_FIELDS)


def sla_class_validate(sla_class: SlaClass) -> None:
    """Raise a ``ValidationError`` keyed by the wrong field; the rules that span rows or need
    ``governance.sla_windows`` and so cannot live on the model's fields."""
    errors: dict[str, str] = {}
    try:
        windows = parse_windows(sla_class.windows)
    except WindowError as exc:
        errors["windows"] = str(exc)
        windows = None
    try:
        zone(sla_class.time_zone)
    except WindowError as exc:
        errors["time_zone"] = str(exc)
    turnaround = sla_class.turnaround_seconds
    if turnaround is not None and turnaround < MIN_TURNAROUND_SECONDS:
        errors["turnaround_seconds"] = (
            f"At least {MIN_TURNAROUND_SECONDS} seconds, or empty for the end of the next window."
        )
    elif turnaround is None and windows == ():
        # "By the end of the next window" with no window names no time at all.
        errors["turnaround_seconds"] = (
            "Give a turnaround, or processing windows whose end it can be promised by."
        )
    kinds = sla_class.kinds
    if not isinstance(kinds, list) or not kinds:
        errors["kinds"] = f"Choose one or more of {', '.join(FileKind.values)}."
    else:
        unknown = [k for k in kinds if k not in FileKind.values]
        if unknown:
            errors["kinds"] = (
                f"Unknown kind(s) {unknown}; choose from {', '.join(FileKind.values)}."
            )
        elif len(set(kinds)) != len(kinds):
            errors["kinds"] = "Name each kind once."
    if sla_class.max_file_bytes is None or sla_class.max_file_bytes < 1:
        errors["max_file_bytes"] = "At least 1 byte."
    if (
        sla_class.priority_class_id is None
        or not PriorityClass.objects.filter(pk=sla_class.priority_class_id).exists()
    ):
        errors["priority_class"] = "Name an existing priority class."
    if sla_class.use_case_id is not None:
        same_name = SlaClass.objects.filter(use_case_id=sla_class.use_case_id, name=sla_class.name)
        if sla_class.pk is not None:
            same_name = same_name.exclude(pk=sla_class.pk)
        if same_name.exists():
            errors["name"] = f"This use case already has an SLA class called '{sla_class.name}'."
    if errors:
        raise ValidationError(errors)


def sla_class_create(
    *, actor: Actor, use_case: UseCase, name: str, priority_class: PriorityClass, **fields: Any
) -> SlaClass:
    """Give a use case an SLA class (officers and admins only; audited)."""
    unknown = sorted(set(fields) - EDITABLE_FIELDS)
    if unknown:
        raise ValidationError({unknown[0]: "This field cannot be set here."})
    sla_class = SlaClass(use_case=use_case, name=name, priority_class=priority_class, **fields)
    with transaction.atomic():
        sla_class_validate(sla_class)
        return record_create(actor=actor, instance=sla_class)


def sla_class_update(*, actor: Actor, sla_class: SlaClass, changes: Mapping[str, Any]) -> SlaClass:
    """Change an SLA class; the audit event holds before and after. Registrations already
    accepted keep the promise they were given (``promised_by``): a change applies to new ones."""
    if "use_case" in changes and changes["use_case"] != sla_class.use_case:
        raise ValidationError({"use_case": "An SLA class cannot move to another use case."})
    unknown = sorted(set(changes) - EDITABLE_FIELDS - {"use_case"})
    if unknown:
        raise ValidationError({unknown[0]: "This field cannot be changed here."})
    with transaction.atomic():
        for field, value in changes.items():
            setattr(sla_class, field, value)
        sla_class_validate(sla_class)
        return record_update(actor=actor, instance=sla_class, changes=changes)


def sla_class_delete(*, actor: Actor, sla_class: SlaClass) -> None:
    """Delete a class no registration uses; one that is used stays, since its registrations'
    promises are read against it (retire it by changing its kinds or windows instead)."""
    require_governor(actor)  # who asks is answered before what the class is used by
    with transaction.atomic():
        used = sla_class.files.count()
        if used:
            raise Conflict(
                f"SLA class '{sla_class.name}' is used by {used} file registration(s); "
                "it cannot be deleted."
            )
        record_delete(actor=actor, instance=sla_class)
