from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("governance.api.urls")),
    # The OpenAI Files and Batch APIs, forwarded here by the gateway (docs/files.md).
    path("v1/", include("governance.api.openai_batch")),
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("", include("portal.urls")),
]
