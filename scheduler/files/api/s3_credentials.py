"""S3 credentials on /api/: list and issue per use case, rotate, revoke (docs/files.md).

The secret is in exactly one response, the one that issued it (issue or rotate), marked
``no-store``; every other answer shows the access key id only.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from governance.api.views import HasSwitchyardRole, actor_of, visible_use_case_or_404
from governance.models import S3Credential
from scheduler.files.s3_credentials import (
    s3_credential_issue,
    s3_credential_revoke,
    s3_credential_rotate,
    s3_credentials_visible,
)


class S3CredentialSerializer(serializers.ModelSerializer[S3Credential]):
    """A credential as anyone with access sees it: never the secret."""

    rotated_from: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="access_key_id", read_only=True, allow_null=True
    )

    class Meta:
        model = S3Credential
        fields = (
            "id",
            "use_case",
            "name",
            "access_key_id",
            "status",
            "created_by",
            "created_at",
            "revealed_at",
            "expires_at",
            "revoked_at",
            "last_used_at",
            "rotated_from",
        )
        read_only_fields = fields


class S3CredentialIssueSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


class S3CredentialRotateSerializer(serializers.Serializer[Any]):
    grace_seconds = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=7 * 86400,
        help_text="Keep the old pair working this long; without it the old pair is revoked now",
    )


class S3CredentialRevokeSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class IssuedS3CredentialSerializer(serializers.Serializer[Any]):
    """The one answer with the secret in it."""

    credential = S3CredentialSerializer()
    secret_access_key = serializers.CharField(help_text="Shown this once; store it now.")


def _issued(credential: S3Credential, secret: str, code: int) -> Response:
    body = IssuedS3CredentialSerializer(
        {"credential": credential, "secret_access_key": secret}
    ).data
    response = Response(body, status=code)
    response["Cache-Control"] = "no-store"
    response["Pragma"] = "no-cache"
    return response


USE_CASE_ID = OpenApiParameter("id", int, OpenApiParameter.PATH, description="The use case's id")


class UseCaseS3CredentialsView(APIView):
    """``/api/use-cases/<id>/s3-credentials/``: a use case's credentials, and issuing one."""

    permission_classes = (HasSwitchyardRole,)

    @extend_schema(
        parameters=[USE_CASE_ID],
        responses=S3CredentialSerializer(many=True),
        summary="A use case's credentials",
    )
    def get(self, request: Request, pk: str) -> Response:
        use_case = visible_use_case_or_404(request.user, pk)
        credentials = s3_credentials_visible(request.user).filter(use_case=use_case)
        return Response(S3CredentialSerializer(credentials, many=True).data)

    @extend_schema(
        parameters=[USE_CASE_ID],
        request=S3CredentialIssueSerializer,
        responses={201: IssuedS3CredentialSerializer},
        summary="Issue an S3 credential; the secret is in this answer only",
    )
    def post(self, request: Request, pk: str) -> Response:
        body = S3CredentialIssueSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        credential, secret = s3_credential_issue(
            actor=actor_of(request),
            use_case=visible_use_case_or_404(request.user, pk),
            name=body.validated_data["name"],
            expires_at=body.validated_data["expires_at"],
        )
        return _issued(credential, secret, status.HTTP_201_CREATED)


class S3CredentialViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """Every S3 credential the person may see; rotate and revoke."""

    serializer_class = S3CredentialSerializer
    permission_classes = (HasSwitchyardRole,)
    search_fields = ("name", "access_key_id")
    ordering_fields = ("created_at", "expires_at", "last_used_at")

    def get_queryset(self) -> QuerySet[S3Credential]:
        return s3_credentials_visible(self.request.user)

    @extend_schema(request=S3CredentialRotateSerializer, responses=IssuedS3CredentialSerializer)
    @action(detail=True, methods=["post"])
    def rotate(self, request: Request, pk: str | None = None) -> Response:
        body = S3CredentialRotateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        grace = body.validated_data.get("grace_seconds")
        credential, secret = s3_credential_rotate(
            actor=actor_of(request),
            credential=self.get_object(),
            grace=timedelta(seconds=grace) if grace is not None else None,
        )
        return _issued(credential, secret, status.HTTP_200_OK)

    @extend_schema(request=S3CredentialRevokeSerializer, responses=S3CredentialSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        body = S3CredentialRevokeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        credential = s3_credential_revoke(
            actor=actor_of(request),
            credential=self.get_object(),
            reason=body.validated_data["reason"],
        )
        return Response(S3CredentialSerializer(credential).data)
