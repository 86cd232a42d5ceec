"""``POST /api/use-cases/{id}/webhook/``: set or clear a use case's webhook (docs/files.md).

The answer carries the new signing secret once; it is never shown again (a new URL, or the
same one set again, makes a new secret). Who may: officers and the tenant's developers
(governance/webhooks.py decides).
"""

from __future__ import annotations

from typing import Any, cast

from django.http import HttpRequest
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from governance.audit import Actor
from governance.models import UseCase
from governance.webhooks import MAX_URL_CHARS, webhook_set


class WebhookSetSerializer(serializers.Serializer[Any]):
    url = serializers.CharField(
        max_length=MAX_URL_CHARS,
        allow_blank=True,
        trim_whitespace=True,
        help_text='http(s) URL notified when a file ends; "" clears it',
    )


class WebhookSecretSerializer(serializers.Serializer[Any]):
    webhook_url = serializers.CharField()
    secret = serializers.CharField(
        allow_null=True, help_text="whsec_…: shown once; null when the webhook was cleared"
    )


class UseCaseWebhookMixin:
    """Adds the ``webhook`` action to the use case viewset."""

    @extend_schema(request=WebhookSetSerializer, responses=WebhookSecretSerializer)
    @action(detail=True, methods=["post"])
    def webhook(self, request: Request, pk: str | None = None) -> Response:
        body = WebhookSetSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        use_case = cast(UseCase, self.get_object())  # type: ignore[attr-defined]
        secret = webhook_set(
            actor=Actor.from_request(cast(HttpRequest, request)),
            use_case=use_case,
            url=body.validated_data["url"],
        )
        return Response({"webhook_url": use_case.webhook_url, "secret": secret})
