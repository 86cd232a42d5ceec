"""Reads of the governance domain, scoped to what the asking person may see.

Developers see their own tenants' records; officers, auditors and admins see everything.
Views build their querysets here, so an object outside the scope is a 404, not a 403.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q, QuerySet
from django.utils import timezone

from governance.choices import ApiKeyStatus, UseCaseStatus
from governance.models import (
    ApiKey,
    AuditEvent,
    GuardrailSelection,
    RateLimitPolicy,
    SlaClass,
    Tenant,
    UseCase,
)
from governance.roles import AnyUser, can_read_everything, visible_tenants


def use_cases_visible(user: AnyUser) -> QuerySet[UseCase]:
    return UseCase.objects.filter(tenant__in=visible_tenants(user)).select_related("tenant")


def guardrails_visible(user: AnyUser) -> QuerySet[GuardrailSelection]:
    return GuardrailSelection.objects.filter(use_case__in=use_cases_visible(user))


def sla_classes_visible(user: AnyUser) -> QuerySet[SlaClass]:
    return SlaClass.objects.filter(use_case__in=use_cases_visible(user)).select_related(
        "use_case__tenant", "priority_class"
    )


def api_keys_visible(user: AnyUser) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(use_case__in=use_cases_visible(user)).select_related(
        "use_case__tenant", "requested_by", "decided_by"
    )


def api_keys_live(now: datetime | None = None) -> QuerySet[ApiKey]:
    """The keys that may act right now: active, unexpired, of an approved use case. The rule
    the gateway's snapshot applies (governance/snapshot.py), so a key the gateway refuses is
    refused on the web process's doors too."""
    return (
        ApiKey.objects.filter(
            status=ApiKeyStatus.ACTIVE,
            key_hash__isnull=False,
            use_case__status=UseCaseStatus.APPROVED,
        )
        .exclude(expires_at__lte=now or timezone.now())
        .select_related("use_case__tenant")
    )


def rate_limits_visible(user: AnyUser) -> QuerySet[RateLimitPolicy]:
    if can_read_everything(user):
        return RateLimitPolicy.objects.all()
    return RateLimitPolicy.objects.filter(
        Q(tenant__isnull=True) | Q(tenant__in=visible_tenants(user))
    )


def audit_events_visible(user: AnyUser) -> QuerySet[AuditEvent]:
    if can_read_everything(user):
        return AuditEvent.objects.all()
    # By id: a slug can be renamed and reused, and history stays with its tenant.
    ids = visible_tenants(user).values_list("pk", flat=True)
    return AuditEvent.objects.filter(tenant_id__in=list(ids))


def legal_hold_reason(instance: Tenant | UseCase) -> str:
    """The reason given when the current hold was placed ("" when there is none)."""
    if not instance.legal_hold:
        return ""
    kind = "usecase" if isinstance(instance, UseCase) else "tenant"
    event = (
        AuditEvent.objects.filter(
            action=f"{kind}.legal_hold_place",
            object_type=instance._meta.label_lower,
            object_id=str(instance.pk),
        )
        .order_by("-sequence")
        .first()
    )
    return str((event.after or {}).get("reason", "")) if event is not None else ""
