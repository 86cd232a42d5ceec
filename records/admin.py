"""Usage roll-ups, admission decisions, guardrail findings and interaction records in the
admin: read-only, they are a record. Transcripts themselves stay in their sealed objects:
the admin shows where they are, not what they say."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from records.models import (
    AdmissionDecision,
    GuardrailFinding,
    GuardrailHour,
    InteractionRecord,
    RecordObject,
    UsageMinute,
)


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(UsageMinute)
class UsageMinuteAdmin(ReadOnlyAdmin):
    list_display = (
        "minute",
        "tenant",
        "use_case_id",
        "model",
        "requests",
        "errors",
        "prompt_tokens",
        "completion_tokens",
        "queued_ms",
        "total_ms",
    )
    list_filter = ("tenant", "model")
    search_fields = ("tenant", "model")
    date_hierarchy = "minute"


@admin.register(AdmissionDecision)
class AdmissionDecisionAdmin(ReadOnlyAdmin):
    list_display = (
        "occurred_at",
        "decision",
        "reason",
        "tenant",
        "use_case_id",
        "key_id",
        "model",
        "queued_ms",
        "request_id",
        "record_id",
        "policy_version",
        "audit_sequence",
    )
    list_filter = ("decision", "reason", "tenant", "model")
    search_fields = ("request_id", "record_id", "reason", "tenant")
    date_hierarchy = "occurred_at"


@admin.register(GuardrailFinding)
class GuardrailFindingAdmin(ReadOnlyAdmin):
    list_display = (
        "occurred_at",
        "guardrail",
        "action",
        "stage",
        "tenant",
        "use_case_id",
        "model",
        "entities",
        "score",
        "request_id",
        "policy_version",
    )
    list_filter = ("guardrail", "action", "stage", "tenant")
    search_fields = ("request_id", "guardrail", "tenant")
    date_hierarchy = "occurred_at"


@admin.register(GuardrailHour)
class GuardrailHourAdmin(ReadOnlyAdmin):
    list_display = ("hour", "tenant", "use_case_id", "guardrail", "action", "findings")
    list_filter = ("guardrail", "action", "tenant")
    date_hierarchy = "hour"


@admin.register(InteractionRecord)
class InteractionRecordAdmin(ReadOnlyAdmin):
    list_display = (
        "occurred_at",
        "record_id",
        "request_id",
        "tenant",
        "use_case_id",
        "key_id",
        "model",
        "status",
        "record_policy",
        "content",
        "object",
        "line",
    )
    list_filter = ("record_policy", "content", "status", "tenant", "model")
    search_fields = ("record_id", "request_id", "tenant")
    date_hierarchy = "occurred_at"
    list_select_related = ("object",)


@admin.register(RecordObject)
class RecordObjectAdmin(ReadOnlyAdmin):
    list_display = (
        "hour",
        "key",
        "use_case_id",
        "tenant_id",
        "records",
        "size",
        "key_id",
        "sealed_sha256",
        "audit_sequence",
    )
    list_filter = ("key_id",)
    search_fields = ("key", "sha256", "sealed_sha256")
    date_hierarchy = "hour"
