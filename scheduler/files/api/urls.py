"""The files domain's part of ``/api/``: registrations, S3 credentials and a use case's webhook
(config/api_urls.py joins it with the other domains'). The OpenAI Files and Batch APIs are
under ``/v1/`` (``scheduler.files.api.openai_batch``)."""

from __future__ import annotations

from typing import Any

from django.urls import re_path

from scheduler.files.api import registrations, s3_credentials, webhooks

ROUTES: list[tuple[str, Any, str]] = [
    ("files", registrations.FileRegistrationViewSet, "file"),
    ("s3-credentials", s3_credentials.S3CredentialViewSet, "s3credential"),
]

urlpatterns = [
    re_path(
        r"^use-cases/(?P<pk>[^/.]+)/s3-credentials/$",
        s3_credentials.UseCaseS3CredentialsView.as_view(),
        name="usecase-s3-credentials",
    ),
    re_path(
        r"^use-cases/(?P<pk>[^/.]+)/webhook/$",
        webhooks.UseCaseWebhookView.as_view(),
        name="usecase-webhook",
    ),
]
