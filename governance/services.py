"""Every write to the governance domain: authorised, validated, audited, republished.

Views, the admin, the portal and policy-as-code all call these, so the rules hold whatever
the door. Each service takes an ``Actor`` (who, from where); the ones a person can trigger
check that person's role and tenant. Every change that the gateway reads republishes the
policy snapshot once the transaction commits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

import valkey
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Model as DjangoModel
from django.utils import timezone

from governance.audit import Actor, audit_record, object_state
from governance.choices import ApiKeyStatus, GuardrailFailure, RecordPolicy, UseCaseStatus
from governance.errors import Conflict
from governance.guardrail_selections import model_change_check, selection_validate
from governance.keys import key_generate, key_hash, key_visible_prefix
from governance.models import ApiKey, GuardrailSelection, Model, Tenant, UseCase
from governance.roles import Role, can_govern, has_role
from governance.snapshot import snapshot_publish

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=DjangoModel)


# --- the policy snapshot ------------------------------------------------------------------
def _publish_after_commit() -> None:
    try:
        snapshot_publish()
    except valkey.ValkeyError as exc:
        # The change is committed; the periodic republish (scheduler beat) carries it to the
        # gateway once Valkey is back. Nothing is lost, it is only late.
        logger.warning("policy_snapshot_publish_deferred error=%s", exc.__class__.__name__)


def policy_changed() -> None:
    """Republish the gateway's snapshot once the current transaction commits.

    However many writes a transaction makes (an admin form, a policy-as-code apply of a
    hundred records), it republishes once: the snapshot is rebuilt whole each time anyway.
    """
    connection = transaction.get_connection()
    already = any(callback is _publish_after_commit for _, callback, *_ in connection.run_on_commit)
    if not already or not connection.in_atomic_block:
        transaction.on_commit(_publish_after_commit)


# --- authorisation ------------------------------------------------------------------------
def _person(actor: Actor) -> AbstractBaseUser | None:
    """The person to check, or None for the platform; anyone else is refused (fail closed).

    Only an explicitly system actor (``Actor.system``, an operator's command) skips the role
    checks: an actor with no user and no flag, such as an anonymous request, is nobody.
    """
    if actor.is_system:
        return None
    if actor.user is None or not actor.user.is_authenticated:
        raise PermissionDenied("Sign in first.")
    return actor.user


def _governs(actor: Actor) -> bool:
    """The platform, an officer or an admin: those who decide rather than ask."""
    user = _person(actor)
    return user is None or can_govern(user)


def _require_governor(actor: Actor) -> None:
    if not _governs(actor):
        raise PermissionDenied("Only a governance officer or an admin may do this.")


def _require_member(actor: Actor, tenant: Tenant) -> None:
    """Developers act on their own tenants only; officers and admins on any."""
    user = _person(actor)
    if user is None or can_govern(user):
        return
    if has_role(user, Role.DEVELOPER) and tenant.members.filter(pk=user.pk).exists():
        return
    raise PermissionDenied(f"You are not a member of tenant '{tenant.slug}'.")


def _same_person(actor: Actor, requester: AbstractBaseUser | None) -> bool:
    """Whether the actor is who asked: the same account, or an operator acting under its name
    (``policy apply --actor olivia``), so that no door lets a person approve their own ask."""
    if requester is None:
        return False
    if actor.user is not None and actor.user.pk == requester.pk:
        return True
    return actor.username == requester.get_username()


def _require_owner(actor: Actor, key: ApiKey, verb: str) -> None:
    """Only the key's requester receives its secret (reveal, rotate): not a teammate, not an
    officer, not the platform."""
    user = _person(actor)
    if user is None or key.requested_by_id != user.pk:
        raise PermissionDenied(f"Only the person who requested this key can {verb} it.")


def _tenant_of(obj: DjangoModel) -> str:
    tenant = getattr(obj, "tenant", None) or getattr(getattr(obj, "use_case", None), "tenant", None)
    if isinstance(obj, Tenant):
        tenant = obj
    return tenant.slug if isinstance(tenant, Tenant) else ""


# --- generic records: tenants, models, deployments, guardrails, policies -----------------
def _set_m2m(instance: DjangoModel, m2m: Mapping[str, Iterable[Any]] | None) -> None:
    for name, values in (m2m or {}).items():
        getattr(instance, name).set(values)


def _action(instance: DjangoModel, verb: str) -> str:
    return f"{instance._meta.model_name}.{verb}"


@transaction.atomic
def record_create(
    *, actor: Actor, instance: M, m2m: Mapping[str, Iterable[Any]] | None = None
) -> M:
    """Validate, save and audit a new governance record (officers and admins only)."""
    _require_governor(actor)
    _prepare(instance, creating=True)
    instance.full_clean()
    instance.save()
    _set_m2m(instance, m2m)
    _after_write(instance)
    audit_record(
        actor=actor,
        action=_action(instance, "create"),
        obj=instance,
        after=object_state(instance),
        tenant_slug=_tenant_of(instance),
    )
    policy_changed()
    return instance


@transaction.atomic
def record_update(
    *,
    actor: Actor,
    instance: M,
    changes: Mapping[str, Any],
    m2m: Mapping[str, Iterable[Any]] | None = None,
) -> M:
    _require_governor(actor)
    before = object_state(type(instance)._default_manager.get(pk=instance.pk))
    for field, value in changes.items():
        setattr(instance, field, value)
    _prepare(instance, creating=False)
    instance.full_clean()
    instance.save()
    _set_m2m(instance, m2m)
    _after_write(instance)
    after = object_state(instance)
    if after != before:
        audit_record(
            actor=actor,
            action=_action(instance, "update"),
            obj=instance,
            before=before,
            after=after,
            tenant_slug=_tenant_of(instance),
        )
        policy_changed()
    return instance


@transaction.atomic
def record_delete(*, actor: Actor, instance: DjangoModel) -> None:
    _require_governor(actor)
    if isinstance(instance, Model):
        model_change_check(instance, deleting=True)
    before = object_state(instance)
    tenant_slug = _tenant_of(instance)
    audit_record(
        actor=actor,
        action=_action(instance, "delete"),
        obj=instance,
        before=before,
        tenant_slug=tenant_slug,
    )
    instance.delete()
    _after_write(instance)
    policy_changed()


def _prepare(instance: DjangoModel, *, creating: bool) -> None:
    """Rules that span rows, for the records that have them, whatever the door."""
    if isinstance(instance, Tenant | UseCase):
        _hold_unchanged(instance, creating=creating)
    if isinstance(instance, UseCase):
        _retention_in_range(instance)
    if isinstance(instance, GuardrailSelection):
        _guardrail_prepare(instance, creating=creating)
    if isinstance(instance, Model) and not creating:
        model_change_check(instance, deleting=False)


def _after_write(instance: DjangoModel) -> None:
    if isinstance(instance, GuardrailSelection):
        _guardrails_renumber(instance.use_case_id, moved=instance if instance.pk else None)


# --- guardrail selections -----------------------------------------------------------------
# Officers only (the generic record services check it): a guardrail decides what a use case
# may send and receive. Each selection is validated against the catalogue and the registered
# models, stored with its complete settings, audited, and republished.
def _lock_guardrails(use_case_id: int) -> None:
    """Serialise changes to one use case's guardrails (its row, FOR UPDATE): two officers
    adding or reordering at once must not both read the same positions."""
    list(UseCase.objects.select_for_update().filter(pk=use_case_id).values_list("pk"))


def _guardrail_prepare(selection: GuardrailSelection, *, creating: bool) -> None:
    if selection.use_case_id is None:
        raise ValidationError({"use_case": "Name the use case."})
    _lock_guardrails(selection.use_case_id)
    if not creating:
        stored = GuardrailSelection.objects.get(pk=selection.pk)
        if stored.use_case_id != selection.use_case_id:
            raise ValidationError({"use_case": "A selection cannot move to another use case."})
    selection.config = selection_validate(
        use_case=selection.use_case,
        guardrail=selection.guardrail,
        side=selection.side,
        action=selection.action,
        config=selection.config,
        exclude_pk=None if creating else selection.pk,
    )


def _guardrails_renumber(use_case_id: int, moved: GuardrailSelection | None = None) -> None:
    """Positions 0, 1, 2… with ``moved`` at the place it asks for and the others, in their
    order, around it: a selection put at 0 runs first and the rest move down one."""
    rows = GuardrailSelection.objects.filter(use_case_id=use_case_id)
    if moved is not None:
        rows = rows.exclude(pk=moved.pk)
    others = list(rows.order_by("position", "pk"))
    if moved is not None and moved.pk is not None:
        others.insert(min(moved.position, len(others)), moved)
    for index, selection in enumerate(others):
        if selection.position != index or selection is moved:
            GuardrailSelection.objects.filter(pk=selection.pk).update(position=index)
            selection.position = index


def _guardrail_order(use_case: UseCase) -> list[str]:
    return [
        f"{g.guardrail}:{g.side}"
        for g in GuardrailSelection.objects.filter(use_case=use_case).order_by("position", "pk")
    ]


def guardrail_add(
    *,
    actor: Actor,
    use_case: UseCase,
    guardrail: str,
    side: str,
    action: str,
    config: Any = None,
    position: int | None = None,
) -> GuardrailSelection:
    """Select a guardrail for a use case; ``position`` None runs it after the others, a
    number puts it there and moves the others down."""
    _require_governor(actor)
    count = GuardrailSelection.objects.filter(use_case=use_case).count()
    if position is not None and not 0 <= position <= count:
        raise ValidationError({"position": f"Choose a position from 0 to {count}."})
    selection = GuardrailSelection(
        use_case=use_case,
        guardrail=guardrail,
        side=side,
        action=action,
        config=config if config is not None else {},
        position=count if position is None else position,
    )
    return record_create(actor=actor, instance=selection)


def guardrail_change(
    *, actor: Actor, selection: GuardrailSelection, changes: Mapping[str, Any]
) -> GuardrailSelection:
    """Change a selection's guardrail, stage, mode, settings or place."""
    unknown = sorted(set(changes) - {"guardrail", "side", "action", "config", "position"})
    if unknown:
        raise ValidationError({unknown[0]: "This field cannot be changed here."})
    return record_update(actor=actor, instance=selection, changes=changes)


def guardrail_remove(*, actor: Actor, selection: GuardrailSelection) -> None:
    record_delete(actor=actor, instance=selection)


@transaction.atomic
def guardrail_reorder(
    *, actor: Actor, use_case: UseCase, order: Sequence[int]
) -> list[GuardrailSelection]:
    """Run the use case's selections in ``order`` (their ids, every one exactly once)."""
    _require_governor(actor)
    _lock_guardrails(use_case.pk)
    current = {g.pk: g for g in GuardrailSelection.objects.filter(use_case=use_case)}
    if len(set(order)) != len(order):
        raise ValidationError({"order": "Name each selection once."})
    if set(order) != set(current):
        missing = sorted(set(current) - set(order))
        foreign = sorted(set(order) - set(current))
        detail = (
            f"selections {foreign} are not this use case's"
            if foreign
            else f"selections {missing} are missing"
        )
        raise ValidationError({"order": f"List every selection of this use case: {detail}."})
    before = _guardrail_order(use_case)
    for index, pk in enumerate(order):
        if current[pk].position != index:
            GuardrailSelection.objects.filter(pk=pk).update(position=index)
    after = _guardrail_order(use_case)
    if after != before:
        audit_record(
            actor=actor,
            action="usecase.guardrails_reorder",
            obj=use_case,
            before={"guardrails": before},
            after={"guardrails": after},
            tenant_slug=use_case.tenant.slug,
        )
        policy_changed()
    return list(GuardrailSelection.objects.filter(use_case=use_case).order_by("position"))


def use_case_set_guardrail_failure(*, actor: Actor, use_case: UseCase, mode: str) -> UseCase:
    """Fail closed (503 when a guardrail cannot run) or open (let through, record it)."""
    _require_governor(actor)
    if mode not in GuardrailFailure.values:
        raise ValidationError(
            {"guardrail_failure": f"Choose one of {', '.join(GuardrailFailure.values)}."}
        )
    return use_case_update(actor=actor, use_case=use_case, changes={"guardrail_failure": mode})


# --- use cases ----------------------------------------------------------------------------
# Fields a developer may set on a draft; everything that grants capacity, priority or access
# (status, models, limits, namespace, guardrails) is the officer's to decide.
DEVELOPER_FIELDS = frozenset(
    {"name", "slug", "kind", "purpose", "data_classification", "ticket_ref"}
)


def _check_developer_fields(actor: Actor, fields: Iterable[str]) -> None:
    if _governs(actor):
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
    _require_member(actor, tenant)
    _check_developer_fields(actor, [*fields, *(["allowed_models"] if allowed_models else [])])
    use_case = UseCase(tenant=tenant, **fields)
    _hold_unchanged(use_case, creating=True)
    _retention_in_range(use_case)
    use_case.full_clean()
    use_case.save()
    if allowed_models is not None:
        use_case.allowed_models.set(allowed_models)
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
    _require_member(actor, use_case.tenant)
    if not _governs(actor):
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
    _retention_in_range(use_case)
    use_case.full_clean()
    use_case.save()
    if allowed_models is not None:
        use_case.allowed_models.set(allowed_models)
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
        _require_governor(actor)
    else:
        _require_member(actor, use_case.tenant)
    if needs_reason and not reason.strip():
        raise ValidationError({"reason": f"Say why you {transition} this use case."})
    submitted = use_case.status == UseCaseStatus.SUBMITTED
    if transition == "approve" and submitted and _same_person(actor, use_case.status_changed_by):
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


# --- interaction records: what the gateway keeps, how long, who reads it, legal holds -------
# Officers and admins decide these; developers and auditors are refused (auditors read every
# record, and change nothing). A legal hold is set and lifted only here, each time with the
# reason in the audit trail, so no form or file can drop one silently.
LEGAL_HOLD_OWN_ACTION = "A legal hold is set or lifted with its own action, giving a reason."


# A century: beyond it a number is a typo (and the column is a 32-bit integer).
RETENTION_DAYS_MAX = 36_500


def _retention_in_range(use_case: UseCase) -> None:
    days = use_case.record_retention_days
    if isinstance(days, int) and not 1 <= days <= RETENTION_DAYS_MAX:
        raise ValidationError(
            {"record_retention_days": f"Keep records from 1 to {RETENTION_DAYS_MAX} days."}
        )


def _hold_unchanged(instance: Tenant | UseCase, *, creating: bool) -> None:
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
    _require_governor(actor)
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
    _require_governor(actor)
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
        tenant_slug=_tenant_of(instance),
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


# --- API keys -----------------------------------------------------------------------------
def _key_lifetime_ok(expires_at: datetime | None) -> None:
    now = timezone.now()
    if expires_at is None:
        return
    if expires_at <= now:
        raise ValidationError({"expires_at": "Choose a time in the future."})
    longest = timedelta(days=settings.API_KEY_MAX_LIFETIME_DAYS)
    if expires_at - now > longest:
        raise ValidationError(
            {"expires_at": f"Keys live at most {settings.API_KEY_MAX_LIFETIME_DAYS} days."}
        )


def _audit_key(actor: Actor, key: ApiKey, action: str, **extra: Any) -> None:
    audit_record(
        actor=actor,
        action=f"apikey.{action}",
        obj=key,
        after={"status": key.status, "prefix": key.prefix, **extra},
        tenant_slug=key.use_case.tenant.slug,
    )


@transaction.atomic
def api_key_request(
    *,
    actor: Actor,
    use_case: UseCase,
    name: str,
    reason: str,
    expires_at: datetime | None = None,
) -> ApiKey:
    """A developer asks for a key for one of their tenant's approved use cases."""
    _require_member(actor, use_case.tenant)
    if use_case.status != UseCaseStatus.APPROVED:
        raise Conflict(f"Keys are issued for approved use cases; this one is {use_case.status}.")
    if not reason.strip():
        raise ValidationError({"reason": "Say what the key is for."})
    _key_lifetime_ok(expires_at)
    key = ApiKey(
        use_case=use_case,
        name=name,
        reason=reason,
        expires_at=expires_at,
        requested_by=cast(Any, actor.user),
        status=ApiKeyStatus.PENDING,
    )
    key.full_clean()
    key.save()
    _audit_key(actor, key, "request", reason=reason)
    return key


@transaction.atomic
def api_key_decide(*, actor: Actor, key: ApiKey, approve: bool, reason: str = "") -> ApiKey:
    """An officer approves or rejects a pending key request; never their own."""
    _require_governor(actor)
    if approve and _same_person(actor, key.requested_by):
        raise PermissionDenied(
            "You requested this key; another officer must approve it. "
            "No one approves their own request."
        )
    if not approve and not reason.strip():
        raise ValidationError({"reason": "Say why the request is rejected."})
    target = ApiKeyStatus.APPROVED if approve else ApiKeyStatus.REJECTED
    decided = ApiKey.objects.filter(pk=key.pk, status=ApiKeyStatus.PENDING).update(
        status=target, decided_by=actor.user, decided_at=timezone.now(), decision_reason=reason
    )
    if not decided:
        key.refresh_from_db()
        raise Conflict(f"This key request was already decided ({key.status}).")
    key.refresh_from_db()
    _audit_key(actor, key, "approve" if approve else "reject", reason=reason)
    return key


def _activate(key_id: int, *, from_status: str) -> str | None:
    """Generate the secret and activate the key, once; returns the plaintext or None."""
    plaintext = key_generate()
    activated = ApiKey.objects.filter(
        pk=key_id, status=from_status, revealed_at__isnull=True
    ).update(
        status=ApiKeyStatus.ACTIVE,
        key_hash=key_hash(plaintext),
        prefix=key_visible_prefix(plaintext),
        revealed_at=timezone.now(),
    )
    return plaintext if activated else None


@transaction.atomic
def api_key_reveal(*, actor: Actor, key: ApiKey) -> tuple[ApiKey, str]:
    """Show an approved key's secret to its requester — exactly once, ever."""
    _require_owner(actor, key, "reveal")
    plaintext = _activate(key.pk, from_status=ApiKeyStatus.APPROVED)
    if plaintext is None:
        key.refresh_from_db()
        if key.revealed_at is not None:
            raise Conflict(
                "This key was already revealed; it cannot be shown again. Rotate it instead."
            )
        raise Conflict(f"Only an approved key can be revealed; this one is {key.status}.")
    key.refresh_from_db()
    _audit_key(actor, key, "reveal")
    policy_changed()
    return key, plaintext


@transaction.atomic
def api_key_rotate(
    *, actor: Actor, key: ApiKey, grace: timedelta | None = None
) -> tuple[ApiKey, str]:
    """Replace an active key: the new one works now, the old one until the grace ends.

    Only the key's owner rotates it, since rotating hands out the new secret: a teammate or
    an officer who must stop a key revokes it instead.
    """
    _require_member(actor, key.use_case.tenant)
    _require_owner(actor, key, "rotate")
    grace = timedelta(seconds=settings.API_KEY_ROTATION_GRACE_SECONDS) if grace is None else grace
    if grace < timedelta(0) or grace > timedelta(days=7):
        raise ValidationError({"grace": "Choose a grace period between 0 and 7 days."})
    if key.status != ApiKeyStatus.ACTIVE:
        raise Conflict(f"Only an active key can be rotated; this one is {key.status}.")
    if ApiKey.objects.filter(rotated_from=key).exists():
        raise Conflict("This key was already rotated; rotate its successor instead.")
    successor = ApiKey.objects.create(
        use_case=key.use_case,
        name=key.name,
        reason=f"rotation of {key.prefix}",
        requested_by=key.requested_by,
        status=ApiKeyStatus.APPROVED,
        decided_by=key.decided_by,
        decided_at=key.decided_at,
        decision_reason="approved as the rotation of an approved key",
        expires_at=key.expires_at,
        rotated_from=key,
    )
    plaintext = _activate(successor.pk, from_status=ApiKeyStatus.APPROVED)
    assert plaintext is not None  # the row was created above, in this transaction
    successor.refresh_from_db()
    grace_end = timezone.now() + grace
    if key.expires_at is None or key.expires_at > grace_end:
        key.expires_at = grace_end
        key.save(update_fields=["expires_at"])
    _audit_key(
        actor,
        successor,
        "rotate",
        rotated_from=key.prefix,
        old_key_expires_at=grace_end.isoformat(),
    )
    policy_changed()
    return successor, plaintext


@transaction.atomic
def api_key_revoke(*, actor: Actor, key: ApiKey, reason: str = "") -> ApiKey:
    _require_member(actor, key.use_case.tenant)
    revocable = (ApiKeyStatus.PENDING, ApiKeyStatus.APPROVED, ApiKeyStatus.ACTIVE)
    revoked = ApiKey.objects.filter(pk=key.pk, status__in=revocable).update(
        status=ApiKeyStatus.REVOKED
    )
    if not revoked:
        key.refresh_from_db()
        raise Conflict(f"This key is already {key.status}.")
    key.refresh_from_db()
    _audit_key(actor, key, "revoke", reason=reason)
    policy_changed()
    return key


@transaction.atomic
def api_key_issue(
    *, actor: Actor, use_case: UseCase, name: str, expires_at: datetime | None = None
) -> tuple[ApiKey, str]:
    """Mint an active key directly, for the platform itself (demo seed, policy-as-code)."""
    if not actor.is_system:
        raise PermissionDenied("People request keys; only the platform mints them directly.")
    _key_lifetime_ok(expires_at)
    key = ApiKey.objects.create(
        use_case=use_case,
        name=name,
        reason="minted by the platform",
        status=ApiKeyStatus.APPROVED,
        decided_at=timezone.now(),
        decision_reason=f"minted by {actor.username}",
        expires_at=expires_at,
    )
    plaintext = _activate(key.pk, from_status=ApiKeyStatus.APPROVED)
    assert plaintext is not None
    key.refresh_from_db()
    _audit_key(actor, key, "issue")
    policy_changed()
    return key, plaintext
