"""Admission decisions in the API: read-only, tenant-scoped, for auditors and developers.

"Why was this request refused at 14:02?" — look the request up here (``request_id``, or a
use case and a time range), read its reason and policy version, and follow ``audit_event``
to the hash-chained audit summary that records its group of refusals.

The rows are written by the usage persister (``records.usage``), never through the API.
Officers, auditors and admins see every tenant's rows; developers their own tenants'.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers, viewsets

from governance.api.views import HasSwitchyardRole
from records.models import AdmissionDecision
from records.selectors import admission_decisions_visible


class AdmissionDecisionSerializer(serializers.ModelSerializer[AdmissionDecision]):
    audit_event = serializers.SerializerMethodField(
        help_text="The audit event summarising this refusal (null for queue waits)."
    )

    class Meta:
        model = AdmissionDecision
        fields = (
            "id",
            "stream_id",
            "request_id",
            "occurred_at",
            "decision",
            "reason",
            "tenant",
            "tenant_id",
            "use_case_id",
            "key_id",
            "model",
            "queued_ms",
            "policy_version",
            "audit_sequence",
            "audit_event",
        )
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.URI)
    def get_audit_event(self, obj: AdmissionDecision) -> str | None:
        if obj.audit_sequence is None:
            return None
        path = reverse("auditevent-detail", kwargs={"sequence": obj.audit_sequence})
        request: Any = self.context.get("request")
        return str(request.build_absolute_uri(path)) if request is not None else path


class AdmissionDecisionViewSet(viewsets.ReadOnlyModelViewSet):  # type: ignore[type-arg]
    """Admission refusals and queue waits, one per request, as the gateway decided them.

    Filter by ``request_id``, ``use_case_id``, ``tenant_id``, ``tenant`` (the slug as the
    gateway saw it), ``model``, ``decision``,
    ``reason``, ``policy_version``, ``audit_sequence`` and a time range
    (``occurred_at__gte``, ``occurred_at__lt``, ISO 8601).
    """

    serializer_class = AdmissionDecisionSerializer
    permission_classes = (HasSwitchyardRole,)
    filterset_fields = {
        "request_id": ["exact"],
        "tenant": ["exact"],
        "tenant_id": ["exact"],
        "use_case_id": ["exact"],
        "key_id": ["exact"],
        "model": ["exact"],
        "decision": ["exact"],
        "reason": ["exact", "startswith"],
        "policy_version": ["exact"],
        "audit_sequence": ["exact"],
        "occurred_at": ["gte", "lt"],
    }
    search_fields = ("request_id", "reason")
    ordering_fields = ("occurred_at", "id")

    def get_queryset(self) -> QuerySet[AdmissionDecision]:
        return admission_decisions_visible(self.request.user)
