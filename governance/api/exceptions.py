"""Domain errors to HTTP, for the whole API, in one place.

Every error but a 400 answers ``{"detail": "..."}``; a 409 for a record that others still refer
to adds ``"code": "protected"`` and ``referenced_by``, the records in the way (docs/api.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Model, ProtectedError, RestrictedError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from governance.errors import Conflict, NotFound

# Enough to act on; the count says how many more there are.
MAX_REFERENCES = 20


class ConflictError(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


def _protected(exc: ProtectedError | RestrictedError) -> Response:
    """409 naming the records that still refer to the one being deleted."""
    referrers: Iterable[Model] = (
        exc.protected_objects if isinstance(exc, ProtectedError) else exc.restricted_objects
    )
    ordered = sorted(referrers, key=lambda obj: (obj._meta.label, str(obj.pk)))
    shown = ordered[:MAX_REFERENCES]
    names = ", ".join(str(obj) for obj in shown)
    more = f" and {len(ordered) - len(shown)} more" if len(ordered) > len(shown) else ""
    return Response(
        {
            "detail": f"Other records still refer to this one: {names}{more}. "
            "Change or remove them first.",
            "code": "protected",
            "referenced_by": [
                {"type": str(obj._meta.verbose_name), "id": str(obj.pk), "repr": str(obj)}
                for obj in shown
            ],
        },
        status=status.HTTP_409_CONFLICT,
    )


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DjangoValidationError):
        detail: Any = exc.message_dict if hasattr(exc, "error_dict") else {"detail": exc.messages}
        exc = exceptions.ValidationError(detail)
    elif isinstance(exc, Conflict):
        exc = ConflictError(str(exc))
    elif isinstance(exc, NotFound):
        exc = exceptions.NotFound(str(exc))
    elif isinstance(exc, ProtectedError | RestrictedError):
        set_rollback()  # as DRF does for its own errors: nothing half-deleted stays
        return _protected(exc)
    elif (
        isinstance(exc, exceptions.ValidationError)
        and isinstance(exc.detail, list)
        and all(isinstance(item, str) for item in exc.detail)
    ):
        # Errors that belong to no field (DRF's search filter refusing a NUL in ``search``)
        # take the documented shape, an object, as a Django ValidationError does above.
        exc = exceptions.ValidationError({"detail": exc.detail})
    return drf_exception_handler(exc, context)


class StoreUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The store (Valkey) cannot be reached; try again shortly."
    default_code = "store_unavailable"
