from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("config.api_urls")),
    # The OpenAI Files and Batch APIs, forwarded here by the gateway (docs/files.md).
    path("v1/", include("scheduler.files.api.openai_batch")),
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("", include("portal.urls")),
]
