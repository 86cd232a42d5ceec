"""The records' part of ``/api/``: decisions, findings, interaction records and the audit
export (config/api_urls.py joins it with the other domains')."""

from __future__ import annotations

from typing import Any

from django.urls import path

from records.api import decisions, findings, records

ROUTES: list[tuple[str, Any, str]] = [
    ("admission-decisions", decisions.AdmissionDecisionViewSet, "admissiondecision"),
    ("guardrail-findings", findings.GuardrailFindingViewSet, "guardrailfinding"),
    ("records", records.RecordViewSet, "record"),
]

urlpatterns = [
    path("audit/export/", records.AuditExportView.as_view(), name="audit-export"),
]
