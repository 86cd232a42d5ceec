"""Interaction records: what the gateway keeps for a use case, for how long, who reads it,
and legal holds.

Officers and admins decide these; developers and auditors are refused (auditors read every
record, and change nothing). A legal hold is set and lifted only here, each time with the
reason in the audit trail, so no form or file can drop one silently. The bounds every other
door keeps are in ``record_bounds``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from governance.audit import Actor, audit_record
from governance.choices import RecordPolicy
from governance.models import Tenant, UseCase
from governance.services.authority import require_governor
from governance.services.generic_records import tenant_of
from governance.services.republish import policy_changed
from governance.services.use_cases import use_case_update


def use_case_set_records(
    *,
    actor: Actor,
    use_case: UseCase,
    policy: str | None = None,
    retention_days: int | None = None,
    developers_can_read: bool | None = None,
) -> UseCase:
    """Set what the gateway records for a use case, for how long, and whether its tenant's
    developers may read it; a None leaves that setting as it is.

    Lowering the retention deletes nothing now: the next retention run (a periodic task)
    removes what has grown older than the new limit, unless a legal hold keeps it.
    """
    require_governor(actor)
    changes: dict[str, Any] = {}
    if policy is not None:
        if policy not in RecordPolicy.values:
            raise ValidationError(
                {"record_policy": f"Choose one of {', '.join(RecordPolicy.values)}."}
            )
        changes["record_policy"] = policy
    if retention_days is not None:
        if isinstance(retention_days, bool) or not isinstance(retention_days, int):
            raise ValidationError({"record_retention_days": "Give a whole number of days."})
        changes["record_retention_days"] = retention_days
    if developers_can_read is not None:
        changes["records_visible_to_developers"] = bool(developers_can_read)
    return use_case_update(actor=actor, use_case=use_case, changes=changes)


def _set_hold(actor: Actor, instance: Tenant | UseCase, hold: bool, reason: str) -> bool:
    """Set the hold with a conditional UPDATE (two officers at once: one change, one audit);
    True when it moved."""
    require_governor(actor)
    if not isinstance(hold, bool):
        raise ValidationError({"hold": "Say true (hold) or false (lift)."})
    if not reason.strip():
        verb = "placed" if hold else "lifted"
        raise ValidationError({"reason": f"Say why the legal hold is {verb}."})
    if len(reason) > 2000:
        raise ValidationError({"reason": "Keep the reason to 2,000 characters."})
    moved = (
        type(instance)
        ._default_manager.filter(pk=instance.pk, legal_hold=not hold)
        .update(legal_hold=hold, updated_at=timezone.now())
    )
    instance.refresh_from_db()
    if not moved:
        return False
    kind = "usecase" if isinstance(instance, UseCase) else "tenant"
    audit_record(
        actor=actor,
        action=f"{kind}.legal_hold_{'place' if hold else 'lift'}",
        obj=instance,
        before={"legal_hold": not hold},
        after={"legal_hold": hold, "reason": reason},
        tenant_slug=tenant_of(instance),
    )
    policy_changed()
    return True


@transaction.atomic
def use_case_set_legal_hold(*, actor: Actor, use_case: UseCase, hold: bool, reason: str) -> UseCase:
    """Place or lift a legal hold on one use case's records; retention skips them while held.

    Asking for the state it is already in changes nothing and records nothing.
    """
    _set_hold(actor, use_case, hold, reason)
    return use_case


@transaction.atomic
def tenant_set_legal_hold(*, actor: Actor, tenant: Tenant, hold: bool, reason: str) -> Tenant:
    """Place or lift a legal hold on every use case's records of a tenant."""
    _set_hold(actor, tenant, hold, reason)
    return tenant
