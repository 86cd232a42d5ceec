"""Governance's part of ``/api/``: its routes and views (config/api_urls.py joins them)."""

from __future__ import annotations

from typing import Any

from csp.decorators import csp_update
from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from governance.api import dead_letters, sla_classes, views

# The router is built by config/api_urls.py from every domain's ROUTES (governance, records,
# files), so that /api/ lists them all.
ROUTES: list[tuple[str, Any, str]] = [
    ("tenants", views.TenantViewSet, "tenant"),
    ("models", views.ModelViewSet, "model"),
    ("deployments", views.DeploymentViewSet, "deployment"),
    ("use-cases", views.UseCaseViewSet, "usecase"),
    ("guardrail-selections", views.GuardrailSelectionViewSet, "guardrailselection"),
    ("sla-classes", sla_classes.SlaClassViewSet, "slaclass"),
    ("priority-classes", views.PriorityClassViewSet, "priorityclass"),
    ("priority-rules", views.PriorityRuleViewSet, "priorityrule"),
    ("rate-limit-policies", views.RateLimitPolicyViewSet, "ratelimitpolicy"),
    ("api-keys", views.ApiKeyViewSet, "apikey"),
    ("audit-events", views.AuditEventViewSet, "auditevent"),
]

urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path(
        "guardrails/catalogue/",
        views.GuardrailCatalogueView.as_view(),
        name="guardrail-catalogue",
    ),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view loads its start-up script from a URL, not inline, as the
    # Content-Security-Policy requires; Swagger UI's own page styles are inline.
    path(
        "docs/",
        csp_update({"style-src": ["'unsafe-inline'"]})(
            SpectacularSwaggerSplitView.as_view(url_name="schema")
        ),
        name="api-docs",
    ),
    path(
        "async/dead-letters/",
        dead_letters.DeadLetterListView.as_view(),
        name="async-dead-letters",
    ),
    re_path(
        rf"^async/dead-letters/(?P<entry_id>{dead_letters.ENTRY_ID_PATTERN})/replay/$",
        dead_letters.DeadLetterReplayView.as_view(),
        name="async-dead-letter-replay",
    ),
    re_path(
        rf"^async/dead-letters/(?P<entry_id>{dead_letters.ENTRY_ID_PATTERN})/discard/$",
        dead_letters.DeadLetterDiscardView.as_view(),
        name="async-dead-letter-discard",
    ),
]
