"""Reads of the records, scoped to what the asking person may see: every tenant's for
officers, auditors and admins, their own tenants' for developers (as with the audit trail)."""

from __future__ import annotations

from django.db.models import QuerySet

from governance.roles import AnyUser, can_read_everything, visible_tenants
from records.models import AdmissionDecision, GuardrailFinding, GuardrailHour


def admission_decisions_visible(user: AnyUser) -> QuerySet[AdmissionDecision]:
    """The gateway's admission decisions a user may read: every tenant's for officers,
    auditors and admins, their own tenants' for developers (as with the audit trail)."""
    if can_read_everything(user):
        return AdmissionDecision.objects.all()
    ids = visible_tenants(user).values_list("pk", flat=True)
    return AdmissionDecision.objects.filter(tenant_id__in=list(ids))


def guardrail_findings_visible(user: AnyUser) -> QuerySet[GuardrailFinding]:
    """Guardrail findings: every use case's for officers, auditors and admins; developers see
    their own tenants' use cases' only."""
    if can_read_everything(user):
        return GuardrailFinding.objects.all()
    ids = visible_tenants(user).values_list("pk", flat=True)
    return GuardrailFinding.objects.filter(tenant_id__in=list(ids))


def guardrail_hours_visible(user: AnyUser) -> QuerySet[GuardrailHour]:
    if can_read_everything(user):
        return GuardrailHour.objects.all()
    ids = visible_tenants(user).values_list("pk", flat=True)
    return GuardrailHour.objects.filter(tenant_id__in=list(ids))
