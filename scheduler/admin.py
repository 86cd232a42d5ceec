"""Usage roll-ups, admission decisions and guardrail findings in the admin: read-only, they
are a record."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from scheduler.models import AdmissionDecision, GuardrailFinding, GuardrailHour, UsageMinute


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
        "policy_version",
        "audit_sequence",
    )
    list_filter = ("decision", "reason", "tenant", "model")
    search_fields = ("request_id", "reason", "tenant")
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
