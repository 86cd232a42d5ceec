"""File registrations on /api/files/ (docs/files.md): register, list, show, cancel, and
download the original (Range-capable) and outputs, each download audited.

Who: a developer of the use case's tenant (session or service-account JWT, as everywhere on
/api/), officers and admins, or an API key of the use case itself (``Bearer sk-sy-…``: the
only /api/ endpoints that take keys, so that the program that will upload a file can
announce it first). Auditors read. The answer is the feasibility model's (scheduler/
feasibility.py): 201 with the promise, or 409 with ``earliest_possible`` and nothing stored.
"""

from __future__ import annotations

from typing import Any, cast

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseBase
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import exceptions, mixins, permissions, serializers, status, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from governance.api.authentication import (
    ApiKeyAuthentication,
    ApiKeyUser,
    ServiceAccountJWTAuthentication,
)
from governance.api.exceptions import StoreUnavailable
from governance.api.serializers import ErrorSerializer
from governance.audit import Actor
from governance.choices import FileKind, FileState
from governance.models import ApiKey, FileRegistration, Model, SlaClass, UseCase
from governance.roles import roles_of
from governance.selectors import use_cases_visible
from runtime.valkey_urls import VALKEY_FAILURES
from scheduler.files.audited_downloads import ORIGINAL, file_download_response, output_names
from scheduler.files.registration import (
    Infeasible,
    Registered,
    file_cancel,
    file_register,
    key_actor,
)
from scheduler.files.s3_credentials import upload_block
from scheduler.files.selectors import parts_summary, with_parts_counts


class UploadSerializer(serializers.Serializer[Any]):
    endpoint_url = serializers.CharField()
    bucket = serializers.CharField(help_text="The use case's virtual bucket: <tenant>-<use case>")
    key = serializers.CharField(help_text="<registration id>/<filename>")
    presigned_put_url = serializers.CharField()


class FileRegistrationSerializer(serializers.ModelSerializer[FileRegistration]):
    """A registration as stored: what was declared, the SLA asked for, what was promised."""

    model: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="public_id", read_only=True
    )
    sla_class: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )
    upload = serializers.SerializerMethodField(
        help_text="Where to upload the file over S3 (s3endpoint/), while it waits for it; "
        "presigned_put_url works for an hour without a credential"
    )

    class Meta:
        model = FileRegistration
        fields: tuple[str, ...] = (
            "id",
            "use_case",
            "kind",
            "filename",
            "model",
            "declared_bytes",
            "declared_seconds",
            "declared_pages",
            "declared_lines",
            "sla_class",
            "deadline",
            "not_before",
            "state",
            "state_changed_at",
            "progress",
            "estimated_tokens",
            "promised_by",
            "registered_by",
            "created_at",
            "uploaded_at",
            "source",
            "outputs",
            "counts",
            "parts",
            "failure",
            "upload",
        )
        read_only_fields: tuple[str, ...] = fields

    # The metaclass pops declared fields, so this does not shadow Field.source at runtime.
    source = serializers.SerializerMethodField(  # type: ignore[assignment]
        help_text="What arrived: {bytes, sha256}; null before the upload"
    )
    outputs = serializers.SerializerMethodField(
        help_text="The outputs' names; each downloads at outputs/<name>/"
    )
    parts = serializers.SerializerMethodField(
        help_text="The job's parts: {total, done, running, failed, pending}"
    )

    def get_source(self, file: FileRegistration) -> dict[str, Any] | None:
        if not file.source_object:
            return None
        return {"bytes": file.source_bytes, "sha256": file.source_sha256 or None}

    def get_outputs(self, file: FileRegistration) -> list[str]:
        return output_names(file)

    def get_parts(self, file: FileRegistration) -> dict[str, int]:
        summary = parts_summary(file)
        return {
            "total": summary.total,
            "done": summary.done,
            "running": summary.running,
            "failed": summary.failed,
            "pending": summary.pending,
        }

    @extend_schema_field(UploadSerializer(allow_null=True))
    def get_upload(self, file: FileRegistration) -> dict[str, str] | None:
        return upload_block(file) if file.state == FileState.REGISTERED else None


class CapacitySerializer(serializers.Serializer[Any]):
    tokens_per_second = serializers.FloatField(help_text="Batch tokens/s the answer assumed")
    measured = serializers.BooleanField(
        help_text="False: the model has no measurement yet; a conservative default was used"
    )


class RegisteredSerializer(FileRegistrationSerializer):
    """The answer to a registration: the record, its ETA and the capacity it was judged on."""

    eta = serializers.DateTimeField(help_text="When the work would finish as scheduled now")
    capacity = CapacitySerializer()

    class Meta(FileRegistrationSerializer.Meta):
        fields = (*FileRegistrationSerializer.Meta.fields, "eta", "capacity")
        read_only_fields = fields


class InfeasibleSerializer(serializers.Serializer[Any]):
    """409: the promise cannot be kept (``code`` infeasible), or the use case's state forbids
    registering (no ``earliest_possible``)."""

    detail = serializers.CharField()
    code = serializers.CharField(required=False)
    error = serializers.CharField(required=False)
    earliest_possible = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="The earliest completion that could be promised; null: none within a year",
    )


class FileRegisterSerializer(serializers.Serializer[Any]):
    """The body of a registration; exactly one of ``sla_class`` and ``deadline``."""

    use_case = serializers.IntegerField(
        required=False, help_text="The use case's id; with an API key, the key's by default"
    )
    kind = serializers.ChoiceField(choices=FileKind.choices)
    filename = serializers.CharField(max_length=255)
    model = serializers.CharField(max_length=128, help_text="The model's public id")
    declared_bytes = serializers.IntegerField(min_value=1)
    declared_seconds = serializers.FloatField(required=False, min_value=0.001, allow_null=True)
    declared_pages = serializers.IntegerField(required=False, min_value=1, allow_null=True)
    declared_lines = serializers.IntegerField(required=False, min_value=1, allow_null=True)
    sla_class = serializers.CharField(
        required=False, allow_null=True, max_length=63, help_text="The SLA class's name"
    )
    deadline = serializers.DateTimeField(required=False, allow_null=True)
    not_before = serializers.DateTimeField(required=False, allow_null=True)


class FileCancelSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class MayRegisterFiles(permissions.BasePermission):
    """An API key (checked against the use case by the service), or a person with a role."""

    message = "Your account has no Switchyard role; ask an administrator for one."

    def has_permission(self, request: Request, view: APIView) -> bool:
        if isinstance(request.auth, ApiKey):
            return True
        return bool(request.user and request.user.is_authenticated and roles_of(request.user))


def _key_of(request: Request) -> ApiKey | None:
    return request.auth if isinstance(request.auth, ApiKey) else None


def _actor(request: Request) -> Actor:
    key = _key_of(request)
    django_request = cast(HttpRequest, request)
    if key is None:
        return Actor.from_request(django_request)
    origin = Actor.from_request(django_request)
    return key_actor(key, request_id=origin.request_id, source_ip=origin.source_ip)


@extend_schema_view(
    list=extend_schema(summary="Registrations this account (or key) may see"),
    retrieve=extend_schema(summary="One registration"),
)
class FileRegistrationViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """Files announced before upload, each with the feasibility answer it was accepted on."""

    serializer_class = FileRegistrationSerializer
    authentication_classes = (
        ServiceAccountJWTAuthentication,  # first: its challenge decides a 401
        ApiKeyAuthentication,
        SessionAuthentication,
    )
    permission_classes = (MayRegisterFiles,)
    search_fields = ("filename",)
    ordering_fields = ("created_at", "promised_by", "state")

    def get_queryset(self) -> QuerySet[FileRegistration]:
        # A GROUP BY query ignores Meta.ordering: order it again, for stable pages.
        files = with_parts_counts(
            FileRegistration.objects.select_related("use_case__tenant", "model", "sla_class")
        ).order_by("-created_at", "-pk")
        key = _key_of(self.request)
        if key is not None:
            return files.filter(use_case_id=key.use_case_id)
        return files.filter(use_case__in=use_cases_visible(self.request.user))

    def perform_content_negotiation(
        self, request: Request, force: bool = False
    ) -> tuple[BaseRenderer, str]:
        """A download may be asked for with any Accept (an audio element sends ``audio/*``):
        it is not rendered, and its errors are JSON whatever was asked."""
        downloading = getattr(self, "action", None) in {"original", "output"}
        return super().perform_content_negotiation(request, force=force or downloading)

    def _use_case(self, request: Request, use_case_id: int | None) -> UseCase:
        key = _key_of(request)
        if key is not None:
            if use_case_id is not None and use_case_id != key.use_case_id:
                raise exceptions.PermissionDenied("This API key belongs to another use case.")
            return key.use_case
        if use_case_id is None:
            raise exceptions.ValidationError({"use_case": ["This field is required."]})
        found = use_cases_visible(request.user).filter(pk=use_case_id).first()
        if found is None:
            raise exceptions.NotFound("No such use case.")
        return found

    @extend_schema(
        request=FileRegisterSerializer,
        responses={
            201: RegisteredSerializer,
            409: OpenApiResponse(InfeasibleSerializer, description="Infeasible, or not now"),
            503: OpenApiResponse(ErrorSerializer, description="The scheduler's store is down"),
        },
        summary="Register a file: an instant answer, promised or refused",
    )
    def create(self, request: Request) -> Response:
        body = FileRegisterSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        use_case = self._use_case(request, data.get("use_case"))
        model = Model.objects.filter(public_id=data["model"]).first()
        if model is None:
            raise exceptions.ValidationError({"model": [f"No model '{data['model']}'."]})
        sla_class = None
        if data.get("sla_class"):
            sla_class = SlaClass.objects.filter(use_case=use_case, name=data["sla_class"]).first()
            if sla_class is None:
                raise exceptions.ValidationError(
                    {"sla_class": [f"The use case has no SLA class '{data['sla_class']}'."]}
                )
        try:
            registered = file_register(
                actor=_actor(request),
                use_case=use_case,
                kind=data["kind"],
                filename=data["filename"],
                model=model,
                declared_bytes=data["declared_bytes"],
                declared_seconds=data.get("declared_seconds"),
                declared_pages=data.get("declared_pages"),
                declared_lines=data.get("declared_lines"),
                sla_class=sla_class,
                deadline=data.get("deadline"),
                not_before=data.get("not_before"),
                api_key=_key_of(request),
            )
        except Infeasible as refused:
            earliest = refused.earliest_possible
            return Response(
                {
                    "detail": str(refused),
                    "code": "infeasible",
                    "error": str(refused),
                    "earliest_possible": earliest.isoformat() if earliest else None,
                },
                status=status.HTTP_409_CONFLICT,
            )
        except VALKEY_FAILURES as exc:
            raise StoreUnavailable() from exc
        return Response(_answer(registered), status=status.HTTP_201_CREATED)

    @extend_schema(
        request=FileCancelSerializer,
        responses={
            200: FileRegistrationSerializer,
            503: OpenApiResponse(ErrorSerializer, description="The scheduler's store is down"),
        },
        summary="Cancel a registration and release its promise",
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        body = FileCancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            file = file_cancel(
                actor=_actor(request),
                file=self.get_object(),
                api_key=_key_of(request),
                reason=body.validated_data["reason"],
            )
        except VALKEY_FAILURES as exc:
            raise StoreUnavailable() from exc
        return Response(FileRegistrationSerializer(file).data)

    # --- downloads (docs/files.md "In the portal"): audited, Range-capable ------------------
    @extend_schema(
        responses={
            (200, "application/octet-stream"): OpenApiResponse(description="The original"),
            (206, "application/octet-stream"): OpenApiResponse(description="A byte range"),
            404: OpenApiResponse(ErrorSerializer, description="Not uploaded, or not yours"),
            416: OpenApiResponse(description="The range starts past the end"),
        },
        parameters=[
            OpenApiParameter(
                "Range",
                location=OpenApiParameter.HEADER,
                required=False,
                description="One byte range, e.g. bytes=0-1023, bytes=1024-, bytes=-500",
            )
        ],
        summary="Download (or stream a byte range of) the uploaded original; audited",
    )
    @action(detail=True, methods=["get"])
    def original(self, request: Request, pk: str | None = None) -> HttpResponseBase:
        return file_download_response(
            request._request, self.get_object(), ORIGINAL, actor=_actor(request)
        )

    @extend_schema(
        responses={
            (200, "application/octet-stream"): OpenApiResponse(description="The output"),
            404: OpenApiResponse(ErrorSerializer, description="No such output, or not yours"),
        },
        summary="Download one output (transcript, summary, results…) by name; audited",
    )
    @action(
        detail=True,
        methods=["get"],
        url_path=r"outputs/(?P<name>[A-Za-z0-9._-]{1,100})",
    )
    def output(self, request: Request, name: str, pk: str | None = None) -> HttpResponseBase:
        if name == ORIGINAL:
            raise exceptions.NotFound("No such output.")
        return file_download_response(
            request._request, self.get_object(), name, actor=_actor(request)
        )


def _answer(registered: Registered) -> dict[str, Any]:
    data = dict(FileRegistrationSerializer(registered.file).data)
    answer = registered.answer
    data["eta"] = answer.eta.isoformat() if answer.eta else None
    data["capacity"] = {"tokens_per_second": answer.rate, "measured": answer.measured}
    return data


__all__ = ["ApiKeyUser", "FileRegistrationViewSet"]
