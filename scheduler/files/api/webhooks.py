"""``POST /api/use-cases/{id}/webhook/``: set or clear a use case's webhook (docs/files.md).

The answer carries the new signing secret once; it is never shown again (a new URL, or the
same one set again, makes a new secret). Who may: officers and the tenant's developers
(scheduler/files/webhook_settings.py decides).
"""

from __future__ import annotations

from typing import Any, cast

from django.http import HttpRequest
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from governance.api.views import HasSwitchyardRole, visible_use_case_or_404
from governance.audit import Actor
from scheduler.files.webhook_settings import MAX_URL_CHARS, webhook_set


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


USE_CASE_ID = OpenApiParameter("id", int, OpenApiParameter.PATH, description="The use case's id")


class UseCaseWebhookView(APIView):
    """``POST /api/use-cases/<id>/webhook/``: a view of its own (not an action of the use case
    viewset, which governance owns and which therefore knows nothing of files)."""

    permission_classes = (HasSwitchyardRole,)

    @extend_schema(
        parameters=[USE_CASE_ID],
        request=WebhookSetSerializer,
        responses=WebhookSecretSerializer,
        summary="Set or clear a use case's webhook; the new secret is in this answer only",
    )
    def post(self, request: Request, pk: str) -> Response:
        use_case = visible_use_case_or_404(request.user, pk)
        body = WebhookSetSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        secret = webhook_set(
            actor=Actor.from_request(cast(HttpRequest, request)),
            use_case=use_case,
            url=body.validated_data["url"],
        )
        return Response({"webhook_url": use_case.webhook_url, "secret": secret})
