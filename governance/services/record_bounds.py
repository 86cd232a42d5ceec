"""The two rules on a use case's interaction-record settings that every door keeps.

Retention stays within bounds, and a legal hold moves only through its own action, with a
reason (``record_policy``): the generic doors (record services, admin forms, policy files)
and the use-case services all check these before they save.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError

from governance.models import Tenant, UseCase

LEGAL_HOLD_OWN_ACTION = "A legal hold is set or lifted with its own action, giving a reason."


# A century: beyond it a number is a typo (and the column is a 32-bit integer).
RETENTION_DAYS_MAX = 36_500


def retention_in_range(use_case: UseCase) -> None:
    days = use_case.record_retention_days
    if isinstance(days, int) and not 1 <= days <= RETENTION_DAYS_MAX:
        raise ValidationError(
            {"record_retention_days": f"Keep records from 1 to {RETENTION_DAYS_MAX} days."}
        )


def hold_unchanged(instance: Tenant | UseCase, *, creating: bool) -> None:
    """The generic doors (record services, admin forms, policy files) never move a hold."""
    stored = False
    if not creating and instance.pk is not None:
        stored = bool(
            type(instance)
            ._default_manager.filter(pk=instance.pk)
            .values_list("legal_hold", flat=True)
            .first()
        )
    if instance.legal_hold != stored:
        raise ValidationError({"legal_hold": LEGAL_HOLD_OWN_ACTION})
