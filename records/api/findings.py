"""Guardrail findings in the API: read-only, scoped like the admission decisions.

"What did the PII guardrail redact for this use case yesterday, and which requests did the
injection classifier block?" — one row per guardrail that found something (or could not
run) in one stage of one request, with entity types and counts, never the text. Officers,
auditors and admins see every use case's; developers their own tenants' use cases'.
``/api/guardrail-findings/counts/`` sums the hourly roll-up by guardrail and action.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet, Sum
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from governance.api.views import HasSwitchyardRole
from records.models import GuardrailFinding
from records.selectors import guardrail_findings_visible, guardrail_hours_visible


class GuardrailFindingSerializer(serializers.ModelSerializer[GuardrailFinding]):
    class Meta:
        model = GuardrailFinding
        fields = (
            "id",
            "stream_id",
            "request_id",
            "occurred_at",
            "tenant",
            "tenant_id",
            "use_case_id",
            "key_id",
            "model",
            "stage",
            "guardrail",
            "action",
            "entities",
            "score",
            "policy_version",
        )
        read_only_fields = fields


class GuardrailCountSerializer(serializers.Serializer[Any]):
    guardrail = serializers.CharField()
    action = serializers.CharField()
    findings = serializers.IntegerField()


class _CountsQuery(serializers.Serializer[Any]):
    use_case_id = serializers.IntegerField(required=False, min_value=1, max_value=2**63 - 1)
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)


class GuardrailFindingViewSet(viewsets.ReadOnlyModelViewSet):  # type: ignore[type-arg]
    """Guardrail findings, newest first.

    Filter by ``request_id``, ``use_case_id``, ``tenant_id``, ``tenant``, ``model``, ``stage``,
    ``guardrail``, ``action``, ``policy_version`` and a time range (``occurred_at__gte``,
    ``occurred_at__lt``, ISO 8601).
    """

    serializer_class = GuardrailFindingSerializer
    permission_classes = (HasSwitchyardRole,)
    filterset_fields = {
        "request_id": ["exact"],
        "tenant": ["exact"],
        "tenant_id": ["exact"],
        "use_case_id": ["exact"],
        "key_id": ["exact"],
        "model": ["exact"],
        "stage": ["exact"],
        "guardrail": ["exact"],
        "action": ["exact"],
        "policy_version": ["exact"],
        "occurred_at": ["gte", "lt"],
    }
    search_fields = ("request_id", "guardrail")
    ordering_fields = ("occurred_at", "id")

    def get_queryset(self) -> QuerySet[GuardrailFinding]:
        return guardrail_findings_visible(self.request.user)

    @extend_schema(
        parameters=[
            OpenApiParameter("use_case_id", int),
            OpenApiParameter("since", str, description="ISO 8601; hours from this one"),
            OpenApiParameter("until", str, description="ISO 8601; hours before this one"),
        ],
        responses=GuardrailCountSerializer(many=True),
    )
    @action(detail=False, methods=["get"], pagination_class=None, filter_backends=[])
    def counts(self, request: Request) -> Response:
        """Findings by guardrail and action, from the hourly roll-up (kept longer than rows)."""
        query = _CountsQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        hours = guardrail_hours_visible(request.user)
        if "use_case_id" in query.validated_data:
            hours = hours.filter(use_case_id=query.validated_data["use_case_id"])
        if "since" in query.validated_data:
            hours = hours.filter(hour__gte=query.validated_data["since"])
        if "until" in query.validated_data:
            hours = hours.filter(hour__lt=query.validated_data["until"])
        rows = (
            hours.values("guardrail", "action")
            .annotate(findings=Sum("findings"))
            .order_by("guardrail", "action")
        )
        return Response(GuardrailCountSerializer(rows, many=True).data)
