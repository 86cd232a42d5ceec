"""Create, change and delete any governance record: tenants, models, deployments, guardrail
selections, policies.

Officers and admins only. Each write is validated (the row's own rules, then the rules that
span rows, for the records that have them), audited with before and after, and republished.
The admin, the API's record endpoints and policy as code all write through these.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from django.db import transaction
from django.db.models import Model as DjangoModel

from governance.audit import Actor, audit_record, object_state
from governance.guardrail_selections import model_change_check
from governance.models import Deployment, GuardrailSelection, Model, Tenant, UseCase
from governance.services.authority import require_governor
from governance.services.guardrail_positions import guardrail_prepare, guardrails_renumber
from governance.services.model_fallbacks import fallbacks_settle
from governance.services.model_lifecycle import lifecycle_audit, lifecycle_prepare
from governance.services.record_bounds import hold_unchanged, retention_in_range
from governance.services.republish import policy_changed

M = TypeVar("M", bound=DjangoModel)


def tenant_of(obj: DjangoModel) -> str:
    """The slug of the tenant a record belongs to, for its audit event ("" for none)."""
    tenant = getattr(obj, "tenant", None) or getattr(getattr(obj, "use_case", None), "tenant", None)
    if isinstance(obj, Tenant):
        tenant = obj
    return tenant.slug if isinstance(tenant, Tenant) else ""


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
    require_governor(actor)
    _prepare(instance, creating=True, previous_status=None)
    instance.full_clean()
    instance.save()
    _set_m2m(instance, m2m)
    if isinstance(instance, UseCase):
        fallbacks_settle(instance, chains_changed=True)
    _after_write(instance)
    audit_record(
        actor=actor,
        action=_action(instance, "create"),
        obj=instance,
        after=object_state(instance),
        tenant_slug=tenant_of(instance),
    )
    if isinstance(instance, Model):
        lifecycle_audit(actor=actor, model=instance, previous_status=None)
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
    require_governor(actor)
    before = object_state(type(instance)._default_manager.get(pk=instance.pk))
    for field, value in changes.items():
        setattr(instance, field, value)
    _prepare(instance, creating=False, previous_status=before.get("status"))
    instance.full_clean()
    instance.save()
    _set_m2m(instance, m2m)
    if isinstance(instance, UseCase):
        fallbacks_settle(
            instance, chains_changed=instance.model_fallbacks != before.get("model_fallbacks")
        )
    _after_write(instance)
    after = object_state(instance)
    if after != before:
        audit_record(
            actor=actor,
            action=_action(instance, "update"),
            obj=instance,
            before=before,
            after=after,
            tenant_slug=tenant_of(instance),
        )
        if isinstance(instance, Model):
            lifecycle_audit(actor=actor, model=instance, previous_status=before.get("status"))
        policy_changed()
    return instance


@transaction.atomic
def record_delete(*, actor: Actor, instance: DjangoModel) -> None:
    require_governor(actor)
    if isinstance(instance, Model):
        model_change_check(instance, deleting=True)
    if isinstance(instance, Deployment):
        instance.check_delete()
    before = object_state(instance)
    tenant_slug = tenant_of(instance)
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


def _prepare(instance: DjangoModel, *, creating: bool, previous_status: str | None) -> None:
    """Rules that span rows, for the records that have them, whatever the door."""
    if isinstance(instance, Tenant | UseCase):
        hold_unchanged(instance, creating=creating)
    if isinstance(instance, UseCase):
        retention_in_range(instance)
    if isinstance(instance, GuardrailSelection):
        guardrail_prepare(instance, creating=creating)
    if isinstance(instance, Model):
        if not creating:
            model_change_check(instance, deleting=False)
        lifecycle_prepare(instance, previous_status=previous_status)


def _after_write(instance: DjangoModel) -> None:
    if isinstance(instance, GuardrailSelection):
        guardrails_renumber(instance.use_case_id, moved=instance if instance.pk else None)
