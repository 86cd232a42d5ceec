from csp.decorators import csp_update
from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from governance.api import (
    async_tasks,
    decisions,
    files,
    findings,
    records,
    s3_credentials,
    sla_classes,
    views,
)

router = DefaultRouter()
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register("models", views.ModelViewSet, basename="model")
router.register("deployments", views.DeploymentViewSet, basename="deployment")
router.register("use-cases", views.UseCaseViewSet, basename="usecase")
router.register(
    "guardrail-selections", views.GuardrailSelectionViewSet, basename="guardrailselection"
)
router.register("sla-classes", sla_classes.SlaClassViewSet, basename="slaclass")
router.register("priority-classes", views.PriorityClassViewSet, basename="priorityclass")
router.register("priority-rules", views.PriorityRuleViewSet, basename="priorityrule")
router.register("rate-limit-policies", views.RateLimitPolicyViewSet, basename="ratelimitpolicy")
router.register("api-keys", views.ApiKeyViewSet, basename="apikey")
router.register("audit-events", views.AuditEventViewSet, basename="auditevent")
router.register(
    "admission-decisions", decisions.AdmissionDecisionViewSet, basename="admissiondecision"
)
router.register("guardrail-findings", findings.GuardrailFindingViewSet, basename="guardrailfinding")
router.register("records", records.RecordViewSet, basename="record")
router.register("files", files.FileRegistrationViewSet, basename="file")
router.register("s3-credentials", s3_credentials.S3CredentialViewSet, basename="s3credential")

urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path(
        "guardrails/catalogue/",
        views.GuardrailCatalogueView.as_view(),
        name="guardrail-catalogue",
    ),
    path("audit/export/", records.AuditExportView.as_view(), name="audit-export"),
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
        async_tasks.DeadLetterListView.as_view(),
        name="async-dead-letters",
    ),
    re_path(
        rf"^async/dead-letters/(?P<entry_id>{async_tasks.ENTRY_ID_PATTERN})/replay/$",
        async_tasks.DeadLetterReplayView.as_view(),
        name="async-dead-letter-replay",
    ),
    re_path(
        rf"^async/dead-letters/(?P<entry_id>{async_tasks.ENTRY_ID_PATTERN})/discard/$",
        async_tasks.DeadLetterDiscardView.as_view(),
        name="async-dead-letter-discard",
    ),
    re_path(
        r"^use-cases/(?P<pk>[^/.]+)/s3-credentials/$",
        s3_credentials.UseCaseS3CredentialsView.as_view(),
        name="usecase-s3-credentials",
    ),
    *router.urls,
]
