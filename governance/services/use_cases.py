"""Use cases: what a tenant runs on the platform, and their lifecycle from draft to retired.

Developers draft and submit use cases for their own tenants and may change a draft's
descriptive fields; everything that grants capacity, priority or access is the officer's to
decide, and no one approves a use case they submitted themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from governance.audit import Actor, audit_record, object_state
from governance.choices import UseCaseStatus
from governance.errors import Conflict
from governance.models import Tenant, UseCase
from governance.services.authority import governs, require_governor, require_member, same_person
from governance.services.model_fallbacks import fallbacks_settle
from governance.services.record_bounds import (
    LEGAL_HOLD_OWN_ACTION,
    hold_unchanged,
    retention_in_range,
)
from governance.services.republish import policy_changed

# Fields a developer may set on a draft; everything that grants capacity, priority or access
# (status, models, limits, namespace, guardrails) is the officer's to decide.
DEVELOPER_FIELDS = frozenset(
    {"name", "slug", "kind", "purpose", "data_classification", "ticket_ref"}
)


def _check_developer_fields(actor: Actor, fields: Iterable[str]) -> None:
    if governs(actor):
        return
    forbidden = sorted(set(fields) - DEVELOPER_FIELDS)
    if forbidden:
        raise PermissionDenied(f"Only an officer may set {', '.join(forbidden)}.")


@transaction.atomic
def use_case_create(
    *,
    actor: Actor,
    tenant: Tenant,
    fields: Mapping[str, Any],
    allowed_models: Iterable[Any] | None = None,
) -> UseCase:
    """A new use case, in draft. Developers create them for their own tenants."""
    require_member(actor, tenant)
    _check_developer_fields(actor, [*fields, *(["allowed_models"] if allowed_models else [])])
    use_case = UseCase(tenant=tenant, **fields)
    hold_unchanged(use_case, creating=True)
    retention_in_range(use_case)
    use_case.full_clean()
    use_case.save()
    if allowed_models is not None:
        use_case.allowed_models.set(allowed_models)
    fallbacks_settle(use_case, chains_changed=True)
    audit_record(
        actor=actor,
        action="usecase.create",
        obj=use_case,
        after=object_state(use_case),
        tenant_slug=tenant.slug,
    )
    return use_case


@transaction.atomic
def use_case_update(
    *,
    actor: Actor,
    use_case: UseCase,
    changes: Mapping[str, Any],
    allowed_models: Iterable[Any] | None = None,
) -> UseCase:
    require_member(actor, use_case.tenant)
    if not governs(actor):
        if use_case.status != UseCaseStatus.DRAFT:
            raise PermissionDenied("Only an officer may change a use case once it is submitted.")
        # A full update sends back every field; only those it would change need the right.
        changing = [f for f, value in changes.items() if getattr(use_case, f, None) != value]
        if allowed_models is not None and set(allowed_models) != set(use_case.allowed_models.all()):
            changing.append("allowed_models")
        _check_developer_fields(actor, changing)
    if "tenant" in changes or "status" in changes:
        raise ValidationError(
            "A use case's tenant and status change only through their own actions."
        )
    if "legal_hold" in changes and changes["legal_hold"] != use_case.legal_hold:
        raise ValidationError({"legal_hold": LEGAL_HOLD_OWN_ACTION})
    before = object_state(UseCase.objects.get(pk=use_case.pk))
    for field, value in changes.items():
        setattr(use_case, field, value)
    retention_in_range(use_case)
    use_case.full_clean()
    use_case.save()
    if allowed_models is not None:
        use_case.allowed_models.set(allowed_models)
    fallbacks_settle(
        use_case, chains_changed=use_case.model_fallbacks != before.get("model_fallbacks")
    )
    after = object_state(use_case)
    if after != before:
        audit_record(
            actor=actor,
            action="usecase.update",
            obj=use_case,
            before=before,
            after=after,
            tenant_slug=use_case.tenant.slug,
        )
        policy_changed()
    return use_case


# transition: (states it may start from, state it ends in, who may do it, reason required)
USE_CASE_TRANSITIONS: dict[str, tuple[frozenset[str], str, str, bool]] = {
    "submit": (frozenset({UseCaseStatus.DRAFT}), UseCaseStatus.SUBMITTED, "member", False),
    "approve": (frozenset({UseCaseStatus.SUBMITTED}), UseCaseStatus.APPROVED, "officer", False),
    "reject": (frozenset({UseCaseStatus.SUBMITTED}), UseCaseStatus.DRAFT, "officer", True),
    "suspend": (frozenset({UseCaseStatus.APPROVED}), UseCaseStatus.SUSPENDED, "officer", True),
    "reinstate": (frozenset({UseCaseStatus.SUSPENDED}), UseCaseStatus.APPROVED, "officer", False),
    "retire": (
        frozenset(
            {
                UseCaseStatus.DRAFT,
                UseCaseStatus.SUBMITTED,
                UseCaseStatus.APPROVED,
                UseCaseStatus.SUSPENDED,
            }
        ),
        UseCaseStatus.RETIRED,
        "officer",
        False,
    ),
}


@transaction.atomic
def use_case_transition(
    *, actor: Actor, use_case: UseCase, transition: str, reason: str = ""
) -> UseCase:
    """Move a use case through its lifecycle; suspension cuts its keys off at the gateway."""
    if transition not in USE_CASE_TRANSITIONS:
        raise ValidationError(
            f"Unknown transition {transition!r}; use {sorted(USE_CASE_TRANSITIONS)}."
        )
    sources, target, who, needs_reason = USE_CASE_TRANSITIONS[transition]
    if who == "officer":
        require_governor(actor)
    else:
        require_member(actor, use_case.tenant)
    if needs_reason and not reason.strip():
        raise ValidationError({"reason": f"Say why you {transition} this use case."})
    submitted = use_case.status == UseCaseStatus.SUBMITTED
    if transition == "approve" and submitted and same_person(actor, use_case.status_changed_by):
        # While submitted, the last to move it is the one who submitted it.
        raise PermissionDenied(
            "You submitted this use case; another officer must approve it. "
            "No one approves their own request."
        )
    # Claim the transition with a conditional UPDATE so two officers clicking at once
    # cannot both win (or act on a state that has already moved).
    previous = use_case.status
    moved = UseCase.objects.filter(pk=use_case.pk, status__in=sources).update(
        status=target,
        status_changed_at=timezone.now(),
        status_changed_by=actor.user if actor.user is not None else None,
        status_reason=reason,
    )
    if not moved:
        use_case.refresh_from_db(fields=["status"])
        raise Conflict(f"Cannot {transition} a use case that is {use_case.status}.")
    use_case.refresh_from_db()
    audit_record(
        actor=actor,
        action=f"usecase.{transition}",
        obj=use_case,
        before={"status": previous},
        after={"status": target, "reason": reason},
        tenant_slug=use_case.tenant.slug,
    )
    policy_changed()
    return use_case
