"""Reads of the records, scoped to what the asking person may see: every tenant's for
officers, auditors and admins, their own tenants' for developers (as with the audit trail)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import F, Max, QuerySet, Sum

from governance.roles import AnyUser, can_read_everything, visible_tenants
from records.models import AdmissionDecision, GuardrailFinding, GuardrailHour, UsageMinute


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


@dataclass(frozen=True)
class ModelCaller:
    """One use case's recent traffic to one model (the usage roll-up's minutes, summed)."""

    use_case_id: int
    requests: int
    tokens: int
    last_minute: datetime


def model_callers(*, model: str, since: datetime) -> list[ModelCaller]:
    """Who still calls ``model`` (as it served: the roll-up keeps the model that answered),
    busiest first; for a deprecated model's page (officers only)."""
    rows = (
        UsageMinute.objects.filter(model=model, minute__gte=since)
        .values("use_case_id")
        .annotate(
            calls=Sum("requests"),
            tokens=Sum(F("prompt_tokens") + F("completion_tokens")),
            last=Max("minute"),
        )
        .order_by("-calls", "use_case_id")
    )
    return [
        ModelCaller(
            use_case_id=row["use_case_id"],
            requests=int(row["calls"] or 0),
            tokens=int(row["tokens"] or 0),
            last_minute=row["last"],
        )
        for row in rows
    ]
