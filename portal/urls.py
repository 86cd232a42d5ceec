from django.contrib.auth import views as auth_views
from django.urls import path, re_path

from portal import async_views, files_views, records_views, views
from portal.audit import views as audit_views
from portal.charts import views as usage_views
from portal.developer import views as developer_views
from portal.developer import work_views
from portal.fleet import views as fleet_views
from portal.officer import price_views
from portal.officer import views as officer_views

app_name = "portal"

urlpatterns = [
    path("", views.home, name="home"),
    path("accounts/login/", views.LocalLoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("dashboard/", views.dashboard, name="dashboard"),
    path("review/", views.review, name="review"),
    path("admission-decisions/", views.admission_decisions, name="admission_decisions"),
    path("guardrail-findings/", views.guardrail_findings, name="guardrail_findings"),
    path("records/", records_views.records, name="records"),
    path("records/export/", records_views.records_export_download, name="records_export"),
    path("records/<str:record_id>/", records_views.record_detail, name="record_detail"),
    # The audit trail (docs/portal.md "Auditors"): filter, verify the chain, signed export.
    path("audit/", audit_views.audit_trail, name="audit_trail"),
    path("audit/verify/", audit_views.audit_chain_verify, name="audit_verify"),
    path("audit/export/", audit_views.audit_export_download, name="audit_export"),
    # The live fleet view (docs/portal.md "Live fleet view"); its websocket: portal/routing.py.
    path("fleet/", fleet_views.fleet, name="fleet"),
    # Files (docs/files.md "In the portal"): progress, parts, history, audited downloads.
    path("files/", files_views.files, name="files"),
    path("files/<int:pk>/", files_views.file_detail, name="file_detail"),
    path("files/<int:pk>/progress/", files_views.file_progress, name="file_progress"),
    path("files/<int:pk>/cancel/", files_views.file_cancel_view, name="file_cancel"),
    path("files/<int:pk>/original/", files_views.file_original, name="file_original"),
    path("files/<int:pk>/outputs/<str:name>/", files_views.file_output, name="file_output"),
    # Async tasks' dead letters (docs/async.md "Dead letters"): replay or discard, audited.
    path("async/dead-letters/", async_views.dead_letters, name="async_dead_letters"),
    re_path(
        r"^async/dead-letters/(?P<entry_id>[0-9]{1,20}-[0-9]{1,20})/replay/$",
        async_views.dead_letter_replay_view,
        name="async_dead_letter_replay",
    ),
    re_path(
        r"^async/dead-letters/(?P<entry_id>[0-9]{1,20}-[0-9]{1,20})/discard/$",
        async_views.dead_letter_discard_view,
        name="async_dead_letter_discard",
    ),
    path("use-cases/<int:pk>/", views.use_case_detail, name="use_case_detail"),
    path(
        "use-cases/<int:pk>/transition/",
        views.use_case_transition_view,
        name="use_case_transition",
    ),
    path("use-cases/<int:pk>/records/", views.use_case_records, name="use_case_records"),
    path("use-cases/<int:pk>/legal-hold/", views.use_case_legal_hold, name="use_case_legal_hold"),
    path("use-cases/<int:pk>/keys/new/", views.key_request, name="key_request"),
    # Usage and charts (docs/portal.md "Usage and charts").
    path("use-cases/<int:pk>/usage/", usage_views.use_case_usage, name="use_case_usage"),
    path(
        "use-cases/<int:pk>/usage/<str:chart>.csv",
        usage_views.use_case_usage_csv,
        name="use_case_usage_csv",
    ),
    path("my-usage/", usage_views.my_usage, name="my_usage"),
    path("keys/<int:pk>/", views.key_detail, name="key_detail"),
    path("keys/<int:pk>/reveal/", views.key_reveal, name="key_reveal"),
    path("keys/<int:pk>/rotate/", views.key_rotate, name="key_rotate"),
    path("keys/<int:pk>/revoke/", views.key_revoke, name="key_revoke"),
    path("keys/<int:pk>/decide/", views.key_decide, name="key_decide"),
]

# A developer's self service (docs/portal.md "Developers"): request a use case, follow its
# status, try it in the playground.
urlpatterns += [
    path("use-cases/new/", developer_views.use_case_request, name="use_case_request"),
    path("use-cases/<int:pk>/status/", developer_views.use_case_status, name="use_case_status"),
    path("use-cases/<int:pk>/playground/", developer_views.playground_chat, name="playground_chat"),
]

# The governance officer's forms (docs/portal.md "Governance officers"): plan, review, apply.

urlpatterns += [
    path("govern/", officer_views.governance_home, name="governance"),
    path("govern/tenants/new/", officer_views.tenant_new, name="tenant_new"),
    path("govern/tenants/<slug:slug>/edit/", officer_views.tenant_edit, name="tenant_edit"),
    path("govern/use-cases/new/", officer_views.use_case_new, name="use_case_new"),
    path("govern/use-cases/<int:pk>/edit/", officer_views.use_case_edit, name="use_case_edit"),
    path(
        "govern/priority-classes/new/",
        officer_views.priority_class_new,
        name="priority_class_new",
    ),
    path(
        "govern/priority-classes/<slug:name>/edit/",
        officer_views.priority_class_edit,
        name="priority_class_edit",
    ),
    path("govern/priority-matrix/", officer_views.priority_matrix, name="priority_matrix"),
]

# Models and deployments, and a use case's SLA classes (officer forms, plan → apply).
urlpatterns += [
    path("govern/models/", officer_views.models_list, name="models"),
    path("govern/models/new/", officer_views.model_new, name="model_new"),
    path("govern/models/<int:pk>/edit/", officer_views.model_edit, name="model_edit"),
    path(
        "govern/models/<int:pk>/deployments/new/",
        officer_views.deployment_new,
        name="deployment_new",
    ),
    path(
        "govern/models/<int:pk>/deployments/<int:deployment_pk>/edit/",
        officer_views.deployment_edit,
        name="deployment_edit",
    ),
    path("govern/models/<int:pk>/prices/new/", price_views.price_new, name="price_new"),
    path(
        "govern/models/<int:pk>/prices/<int:price_pk>/edit/",
        price_views.price_edit,
        name="price_edit",
    ),
    path(
        "govern/models/<int:pk>/prices/<int:price_pk>/withdraw/",
        price_views.price_withdraw,
        name="price_withdraw",
    ),
    path(
        "govern/use-cases/<int:pk>/sla-classes/new/",
        officer_views.sla_class_new,
        name="sla_class_new",
    ),
    path(
        "govern/use-cases/<int:pk>/sla-classes/<slug:name>/edit/",
        officer_views.sla_class_edit,
        name="sla_class_edit",
    ),
    path(
        "govern/use-cases/<int:pk>/sla-classes/<slug:name>/delete/",
        officer_views.sla_class_delete,
        name="sla_class_delete",
    ),
]

# "My work" (docs/portal.md "My work"): the files and async tasks of a person's use cases.
urlpatterns += [
    path("my-work/", work_views.my_work, name="my_work"),
    path("my-work/tasks/", work_views.my_work_tasks, name="my_work_tasks"),
    path("my-work/tasks/<str:task_id>/", work_views.my_work_task, name="my_work_task"),
]
