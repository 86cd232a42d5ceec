"""The OpenAI Files and Batch APIs on the web process: ``/v1/files…`` and ``/v1/batches…``.

The gateway forwards these paths here (gateway/control_proxy.py): they are governance records
(audited, listed, cancelled) in the database, which the gateway's hot path never touches. A
use case's API key authenticates them (``Authorization: Bearer sk-sy-…``), or a Keycloak
service-account token of the client bound to the use case, as on the gateway's /v1; so the
OpenAI SDK works unchanged with ``base_url=<gateway>/v1``. Every answer, errors included, is
in OpenAI's shapes; errors are mapped to them in one place (``openai_exception_handler``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import valkey
from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponseBase
from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, permissions
from rest_framework.parsers import BaseParser, FormParser, JSONParser, MultiPartParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView, set_rollback

from governance.api.authentication import ApiKeyAuthentication, ServiceAccountJWTAuthentication
from governance.audit import Actor
from governance.choices import UseCaseStatus
from governance.errors import Conflict
from governance.models import ApiFile, ApiKey, FileRegistration, UseCase
from governance.streamed_downloads import download_response
from scheduler.files.openai_batches import (
    StoreUnavailable,
    batch_cancel,
    batch_create,
    batch_get,
    batch_object,
    batch_request,
    batches_of,
    batches_started_at,
)
from scheduler.files.openai_files import (
    PURPOSES,
    BatchInputInvalid,
    InvalidRequest,
    apifile_create,
    apifile_delete,
    apifile_download,
    apifile_get,
    apifile_object,
    apifiles_of,
)
from scheduler.files.registration import Infeasible, key_actor

logger = logging.getLogger(__name__)

# Multipart framing around the file, beyond the file's own bytes.
MULTIPART_OVERHEAD = 64 * 1024


def _error(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return Response(body, status=status, headers=headers)


def openai_exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """Every failure of these views in OpenAI's error shape (the SDKs read type and code)."""
    set_rollback()  # as DRF does for its own errors: nothing half-written stays
    if isinstance(exc, BatchInputInvalid):
        return _error(
            400,
            f"The batch input file is invalid: {exc}",
            param="file",
            code="invalid_batch_input",
        )
    if isinstance(exc, InvalidRequest):
        return _error(400, str(exc), param=exc.param)
    if isinstance(exc, ValidationError):
        return _error(400, " ".join(exc.messages))
    if isinstance(exc, Infeasible):
        earliest = exc.earliest_possible
        when = earliest.isoformat() if earliest else "none within ten years"
        # 409 as on /api/files/: the request is valid, the fleet's promises forbid it now. The
        # SDK would retry a 409; asking again at once gets the same answer, so it is told not to.
        return _error(
            409,
            f"{exc} The earliest completion that could be promised: {when}.",
            code="infeasible",
            headers={"x-should-retry": "false"},
        )
    if isinstance(exc, Conflict):
        return _error(409, str(exc), code="conflict", headers={"x-should-retry": "false"})
    if isinstance(exc, ObjectDoesNotExist | exceptions.NotFound):
        what = getattr(context.get("view"), "missing", "object")
        return _error(404, f"No such {what}.", code="not_found")
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        return _error(
            401,
            "You didn't provide an API key. Send it in an Authorization header using Bearer "
            "auth (Authorization: Bearer YOUR_KEY).",
            code="missing_api_key",
        )
    if isinstance(exc, exceptions.APIException) and exc.status_code == 401:
        return _error(401, "Incorrect API key provided.", code="invalid_api_key")
    if isinstance(exc, PermissionDenied | exceptions.PermissionDenied):
        return _error(403, str(exc) or "Not allowed.", type="permission_error")
    if isinstance(exc, StoreUnavailable | valkey.ValkeyError):
        return _error(
            503,
            "The scheduler's store (Valkey) cannot be reached; try again shortly.",
            type="service_unavailable",
            code="store_unavailable",
            headers={"retry-after": "5"},
        )
    if isinstance(exc, exceptions.APIException):
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return _error(exc.status_code, detail, code=str(exc.default_code))
    logger.exception("openai_batch_api_failed view=%s", type(context.get("view")).__name__)
    return _error(500, "The server had an error processing your request.", type="server_error")


class HasCaller(permissions.BasePermission):
    """An API key, or a service-account JWT (its claims): anything else is a 401."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        if not isinstance(request.auth, ApiKey | dict):
            raise exceptions.NotAuthenticated()
        return True


@extend_schema(exclude=True)
class OpenAIView(APIView):
    """A view of the OpenAI-compatible API: a use case's key or its bound service account,
    JSON answers, OpenAI's errors."""

    authentication_classes = (ServiceAccountJWTAuthentication, ApiKeyAuthentication)
    permission_classes = (HasCaller,)
    renderer_classes = (JSONRenderer,)
    parser_classes: tuple[type[BaseParser], ...] = (JSONParser,)
    throttle_classes = ()
    missing = "object"
    use_case: UseCase
    api_key: ApiKey | None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        """Whose files and batches: the key's use case, or the one a service account is bound
        to (``service_account_client_id``, as on the gateway's /v1)."""
        super().initial(request, *args, **kwargs)
        if isinstance(request.auth, ApiKey):
            self.use_case, self.api_key = request.auth.use_case, request.auth
            return
        claims = cast(dict[str, Any], request.auth)
        client = claims.get("azp") or claims.get("client_id")
        bound = (
            UseCase.objects.select_related("tenant")
            .filter(service_account_client_id=client)
            .first()
            if isinstance(client, str) and client
            else None
        )
        if bound is None:
            raise PermissionDenied(
                f"The service account {client!r} is bound to no use case; an officer binds it "
                "on the use case (service-account client)."
            )
        if bound.status != UseCaseStatus.APPROVED:
            # Checked on every request, as the gateway does for the same token (its snapshot
            # leaves a stopped use case's client out): suspending the use case stops it here.
            raise PermissionDenied(
                f"The service account {client!r} is bound to use case {bound}, which is "
                f"{bound.status}; only an approved use case's files and batches can be reached."
            )
        self.use_case, self.api_key = bound, None

    def perform_content_negotiation(
        self, request: Request, force: bool = False
    ) -> tuple[BaseRenderer, str]:
        # The SDK asks file content with "Accept: application/binary": answer whatever the
        # header says (JSON, or the file's bytes) rather than 406.
        return super().perform_content_negotiation(request, force=True)

    def get_exception_handler(self) -> Callable[[Exception, dict[str, Any]], Response]:
        return openai_exception_handler

    def actor(self) -> Actor:
        origin = Actor.from_request(cast(HttpRequest, self.request))
        if self.api_key is None:
            return origin
        return key_actor(self.api_key, request_id=origin.request_id, source_ip=origin.source_ip)


def _limit(request: Request, default: int, most: int) -> int:
    raw = request.query_params.get("limit", str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise InvalidRequest(f"limit must be a whole number from 1 to {most}.", param="limit")
    return int(raw)


def _page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


class FilesView(OpenAIView):
    parser_classes = (MultiPartParser, FormParser)
    missing = "file"

    def post(self, request: Request) -> Response:
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > settings.BATCH_MAX_FILE_BYTES + MULTIPART_OVERHEAD:
            return _error(
                413,
                f"The file is larger than {settings.BATCH_MAX_FILE_BYTES} bytes.",
                param="file",
                code="file_too_large",
            )
        upload = request.FILES.get("file")
        if upload is None:
            raise InvalidRequest("Send the file as the multipart field 'file'.", param="file")
        purpose = request.data.get("purpose", "")
        file, _ = apifile_create(
            actor=self.actor(),
            use_case=self.use_case,
            api_key=self.api_key,
            upload=upload,
            filename=upload.name or "input.jsonl",
            purpose=str(purpose),
        )
        return Response(apifile_object(file), status=200)

    def get(self, request: Request) -> Response:
        files = apifiles_of(self.use_case.pk)
        purpose = request.query_params.get("purpose")
        if purpose is not None:
            if purpose not in PURPOSES:
                raise InvalidRequest(
                    f"purpose must be one of {', '.join(PURPOSES)}.", param="purpose"
                )
            files = files.filter(purpose=purpose)
        order = request.query_params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest('order must be "asc" or "desc".', param="order")
        limit = _limit(request, 10_000, 10_000)
        after = request.query_params.get("after")
        if after:
            cursor = files.filter(public_id=after).values_list("pk", flat=True).first()
            if cursor is None:
                raise InvalidRequest(f"No file with id {after!r} to list after.", param="after")
            files = files.filter(pk__gt=cursor) if order == "asc" else files.filter(pk__lt=cursor)
        rows = list(files.order_by("pk" if order == "asc" else "-pk")[: limit + 1])
        return Response(_page([apifile_object(f) for f in rows[:limit]], len(rows) > limit))


class FileView(OpenAIView):
    missing = "file"

    def get(self, request: Request, file_id: str) -> Response:
        file = apifile_get(use_case_id=self.use_case.pk, public_id=file_id)
        return Response(apifile_object(file))

    def delete(self, request: Request, file_id: str) -> Response:
        file = apifile_get(use_case_id=self.use_case.pk, public_id=file_id)
        apifile_delete(actor=self.actor(), file=file)
        return Response({"id": file.public_id, "object": "file", "deleted": True})


class FileContentView(OpenAIView):
    missing = "file"

    def get(self, request: Request, file_id: str) -> HttpResponseBase:
        file: ApiFile = apifile_get(use_case_id=self.use_case.pk, public_id=file_id)
        return download_response(
            request._request,
            apifile_download(actor=self.actor(), file=file),
            filename=file.filename,
            content_type="application/octet-stream",
        )


class BatchesView(OpenAIView):
    missing = "batch"

    def post(self, request: Request) -> Response:
        batch = batch_create(
            actor=self.actor(),
            use_case=self.use_case,
            api_key=self.api_key,
            request=batch_request(request.data),
        )
        return Response(batch_object(batch))

    def get(self, request: Request) -> Response:
        batches = batches_of(self.use_case.pk)
        limit = _limit(request, 20, 100)
        after = request.query_params.get("after")
        if after:
            try:
                cursor = batch_get(use_case_id=self.use_case.pk, batch_id=after)
            except FileRegistration.DoesNotExist:
                raise InvalidRequest(f"No batch {after!r} to list after.", param="after") from None
            batches = batches.filter(pk__lt=cursor.pk)
        rows = list(batches.order_by("-pk")[: limit + 1])
        started = batches_started_at(rows[:limit])
        data = [batch_object(b, started_at=started.get(b.pk)) for b in rows[:limit]]
        return Response(_page(data, len(rows) > limit))


class BatchView(OpenAIView):
    missing = "batch"

    def get(self, request: Request, batch_id: str) -> Response:
        batch = batch_get(use_case_id=self.use_case.pk, batch_id=batch_id)
        return Response(batch_object(batch, started_at=batches_started_at([batch]).get(batch.pk)))


class BatchCancelView(OpenAIView):
    missing = "batch"

    def post(self, request: Request, batch_id: str) -> Response:
        batch = batch_get(use_case_id=self.use_case.pk, batch_id=batch_id)
        batch, status = batch_cancel(actor=self.actor(), api_key=self.api_key, batch=batch)
        return Response(batch_object(batch, status=status))


urlpatterns = [
    path("files", FilesView.as_view(), name="openai-files"),
    path("files/<str:file_id>", FileView.as_view(), name="openai-file"),
    path("files/<str:file_id>/content", FileContentView.as_view(), name="openai-file-content"),
    path("batches", BatchesView.as_view(), name="openai-batches"),
    path("batches/<str:batch_id>", BatchView.as_view(), name="openai-batch"),
    path("batches/<str:batch_id>/cancel", BatchCancelView.as_view(), name="openai-batch-cancel"),
]
