"""``/api/``: every domain's routes in one router, so that its root lists them all, and their
other views (governance, records, the files domain: each owns its part)."""

from __future__ import annotations

from rest_framework.routers import DefaultRouter

from governance.api import urls as governance_api
from records.api import urls as records_api
from scheduler.files.api import urls as files_api

DOMAINS = (governance_api, records_api, files_api)

router = DefaultRouter()
for domain in DOMAINS:
    for prefix, viewset, basename in domain.ROUTES:
        router.register(prefix, viewset, basename=basename)

urlpatterns = [pattern for domain in DOMAINS for pattern in domain.urlpatterns] + router.urls
