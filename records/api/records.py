"""Interaction records and the signed audit export in the API: read-only.

``/api/records/`` searches (the portal's filters as query parameters), ``/api/records/{id}/``
is one transcript with its content (reading it is audited), ``/api/records/export/`` streams a
selection as JSON Lines or CSV (audited when it starts and when it ends),
``/api/audit/export/`` streams the signed audit trail. Who sees which records is decided in one
place, ``records.reading.records_visible_to``; a record outside it is a 404.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from governance.api.views import CanVerifyAudit, HasSwitchyardRole
from governance.audit import Actor
from governance.audit_export import AuditExportRange, audit_export
from governance.audit_export import export_filename as audit_export_filename
from governance.streamed_downloads import download_response
from records.models import AdmissionDecision, GuardrailFinding, InteractionRecord
from records.reading import (
    EXPORT_FORMATS,
    ExportRefused,
    RecordSearchForm,
    Transcript,
    export_check,
    export_content_type,
    export_filename,
    record_find,
    record_rows,
    records_export,
    records_search,
    transcript_read,
)

_SLUG = r"^[-a-zA-Z0-9_]+$"
SEARCH_PARAMETERS = [
    OpenApiParameter("record_id", str, description="Exact: the x-switchyard-record-id header."),
    OpenApiParameter("request_id", str, description="Exact: the x-request-id header."),
    OpenApiParameter("tenant", str, description="A tenant's slug.", pattern=_SLUG),
    OpenApiParameter("use_case", int, description="A use case's id."),
    OpenApiParameter(
        "key", str, description="A key's id, or the start of its prefix.", pattern=_SLUG
    ),
    OpenApiParameter("model", str),
    OpenApiParameter("status", str, description="Exact (429) or a class (4xx)."),
    OpenApiParameter("guardrail", str, description="Records with a finding of this guardrail."),
    OpenApiParameter(
        "guardrail_action",
        str,
        enum=[value for value, _label in GuardrailFinding.Action.choices],
        description="Records with a finding of this action.",
    ),
    OpenApiParameter(
        "content", str, enum=[value for value, _label in InteractionRecord.Content.choices]
    ),
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="Inclusive (ISO 8601)."),
    OpenApiParameter("until", OpenApiTypes.DATETIME, description="Exclusive (ISO 8601)."),
]


def _search_form(request: Request) -> RecordSearchForm:
    form = RecordSearchForm(request.query_params, user=request.user)
    if not form.is_valid():
        raise exceptions.ValidationError(
            {name: [str(message) for message in errors] for name, errors in form.errors.items()}
        )
    return form


class RecordSerializer(serializers.ModelSerializer[InteractionRecord]):
    use_case = serializers.CharField(
        allow_null=True, help_text="tenant/use-case as it stands now (null once deleted)."
    )
    key_name = serializers.CharField(allow_null=True, help_text="Null once the key is gone.")
    key_prefix = serializers.CharField(allow_null=True)

    class Meta:
        model = InteractionRecord
        fields = (
            "record_id",
            "request_id",
            "occurred_at",
            "tenant",
            "tenant_id",
            "use_case_id",
            "use_case",
            "key_id",
            "key_name",
            "key_prefix",
            "model",
            "endpoint",
            "replica",
            "status",
            "streamed",
            "prompt_tokens",
            "completion_tokens",
            "queued_ms",
            "upstream_ms",
            "total_ms",
            "policy_version",
            "record_policy",
            "content",
            "content_sha256",
            "truncated",
        )
        read_only_fields = fields


def _record_data(record: InteractionRecord, use_case: Any, key: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        name: getattr(record, name)
        for name in RecordSerializer.Meta.fields
        if hasattr(record, name) and name != "use_case"
    }
    data["use_case"] = str(use_case) if use_case is not None else None
    data["key_name"] = key.name if key is not None else None
    data["key_prefix"] = (key.prefix or None) if key is not None else None
    return data


def _serialized(data: dict[str, Any]) -> Any:
    serializer: Any = RecordSerializer
    return serializer(data).data


class _DecisionSerializer(serializers.ModelSerializer[AdmissionDecision]):
    class Meta:
        model = AdmissionDecision
        fields = ("occurred_at", "decision", "reason", "queued_ms", "policy_version")
        read_only_fields = fields


class _FindingSerializer(serializers.ModelSerializer[GuardrailFinding]):
    class Meta:
        model = GuardrailFinding
        fields = ("occurred_at", "stage", "guardrail", "action", "entities", "score")
        read_only_fields = fields


class _ContentSerializer(serializers.Serializer[Any]):
    request = serializers.CharField(help_text="As forwarded, after the request guardrails.")
    request_encoding = serializers.CharField(help_text="utf-8 (text) or base64 (bytes).")
    response = serializers.CharField(help_text="As the client received it.")
    response_encoding = serializers.CharField(help_text="utf-8 (text) or base64 (bytes).")
    response_type = serializers.CharField()
    truncated = serializers.BooleanField()


class _ToolCallFunctionSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    arguments = serializers.CharField()


class _ToolCallSerializer(serializers.Serializer[Any]):
    id = serializers.CharField()
    type = serializers.CharField()
    function = _ToolCallFunctionSerializer()


class _ChoiceSerializer(serializers.Serializer[Any]):
    index = serializers.IntegerField()
    role = serializers.CharField()
    text = serializers.CharField()
    reasoning = serializers.CharField()
    tool_calls = _ToolCallSerializer(many=True)
    finish_reason = serializers.CharField(allow_null=True)


class _AssembledSerializer(serializers.Serializer[Any]):
    choices = _ChoiceSerializer(many=True)
    chunks = serializers.IntegerField()
    done = serializers.BooleanField()
    error = serializers.CharField()


class TranscriptSerializer(serializers.Serializer[Any]):
    record = RecordSerializer()
    admission_decisions = _DecisionSerializer(many=True)
    guardrail_findings = _FindingSerializer(many=True)
    content = _ContentSerializer(allow_null=True, help_text="Null when none was kept.")
    content_problem = serializers.CharField(
        help_text="Why stored content is not shown (it cannot be verified); empty otherwise."
    )
    assembled = _AssembledSerializer(
        allow_null=True, help_text="A streamed answer's chunks put back together."
    )


def _transcript_data(transcript: Transcript) -> dict[str, Any]:
    return {
        "record": _record_data(transcript.record, transcript.use_case, transcript.key),
        "admission_decisions": _DecisionSerializer(transcript.decisions, many=True).data,
        "guardrail_findings": _FindingSerializer(transcript.findings, many=True).data,
        "content": vars(transcript.content) if transcript.content is not None else None,
        "content_problem": transcript.problem,
        "assembled": (
            {
                "choices": [vars(choice) for choice in transcript.assembled.choices],
                "chunks": transcript.assembled.chunks,
                "done": transcript.assembled.done,
                "error": transcript.assembled.error,
            }
            if transcript.assembled is not None
            else None
        ),
    }


class _IgnoreFormatParameter(DefaultContentNegotiation):
    """``?format=`` names the export's file format here, not a DRF renderer."""

    class _Settings:
        URL_FORMAT_OVERRIDE = None

    settings = _Settings()  # type: ignore[assignment]


class RecordViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):  # type: ignore[type-arg]
    """Interaction records, newest first: metadata, and on one record its content.

    Nothing here changes a record: auditors read everything and change nothing.
    """

    serializer_class = RecordSerializer
    permission_classes = (HasSwitchyardRole,)
    lookup_field = "record_id"
    lookup_value_regex = "[0-9A-Za-z_-]{1,40}"
    filter_backends: list[Any] = []

    def get_queryset(self) -> Any:
        return records_search(self.request.user, _search_form(self.request).record_filter())

    @extend_schema(parameters=SEARCH_PARAMETERS)
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        assert page is not None  # the API always paginates
        rows = record_rows(page)
        return self.get_paginated_response(
            [_serialized(_record_data(r.record, r.use_case, r.key)) for r in rows]
        )

    @extend_schema(responses=TranscriptSerializer)
    def retrieve(self, request: Request, record_id: str) -> Response:
        """One record with its decisions, findings and content (reading content is audited)."""
        try:
            record = record_find(request.user, record_id)
        except InteractionRecord.DoesNotExist:
            raise exceptions.NotFound("No such record (or not one this account may see).") from None
        transcript = transcript_read(actor=Actor.from_request(request._request), record=record)
        return Response(TranscriptSerializer(_transcript_data(transcript)).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("format", str, enum=[*EXPORT_FORMATS], default="jsonl"),
            *SEARCH_PARAMETERS,
        ],
        responses={
            (200, "application/jsonl"): OpenApiTypes.STR,
            (200, "text/csv"): OpenApiTypes.STR,
        },
    )
    @action(
        detail=False,
        methods=["get"],
        pagination_class=None,
        content_negotiation_class=_IgnoreFormatParameter,
    )
    def export(self, request: Request) -> HttpResponseBase:
        """The selection as JSON Lines or CSV, streamed, content included where kept; 400
        beyond ``SWITCHYARD_RECORDS_EXPORT_MAX_RECORDS``. Audited when it starts (the filter)
        and when the stream ends (the count)."""
        fmt = request.query_params.get("format", "jsonl")
        found = _search_form(request).record_filter()
        rows = records_search(request.user, found)
        try:
            expected = export_check(rows=rows, fmt=fmt)
        except ExportRefused as refused:
            raise exceptions.ValidationError({"detail": [str(refused)]}) from refused
        chunks = records_export(
            actor=Actor.from_request(request._request),
            rows=rows,
            fmt=fmt,
            described=found.describe(),
            expected=expected,
        )
        return download_response(
            request._request,
            chunks,
            filename=export_filename(fmt),
            content_type=export_content_type(fmt),
        )


class _AuditExportQuery(serializers.Serializer[Any]):
    from_sequence = serializers.IntegerField(required=False, min_value=1, max_value=2**63 - 1)
    to_sequence = serializers.IntegerField(required=False, min_value=1, max_value=2**63 - 1)
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)


class AuditExportView(APIView):
    """The audit trail as signed JSON Lines (officers, auditors, admins): every event with
    its hash, then a summary with the chain's verification, the SHA-256 and an Ed25519
    signature. Check it offline with ``manage.py audit_export_verify``."""

    permission_classes = (HasSwitchyardRole, CanVerifyAudit)

    @extend_schema(
        parameters=[_AuditExportQuery],
        responses={(200, "application/jsonl"): OpenApiTypes.STR},
    )
    def get(self, request: Request) -> HttpResponseBase:
        query = _AuditExportQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        wanted = AuditExportRange(
            from_sequence=data.get("from_sequence"),
            to_sequence=data.get("to_sequence"),
            since=data.get("since"),
            until=data.get("until"),
        )
        chunks = audit_export(actor=Actor.from_request(request._request), wanted=wanted)
        return download_response(
            request._request,
            chunks,
            filename=audit_export_filename(),
            content_type="application/jsonl",
        )
