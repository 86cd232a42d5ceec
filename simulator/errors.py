"""vLLM's error responses: one exception type, rendered in exactly one place (``app``).

vLLM answers request failures as ``{"error": {"message", "type", "param", "code"}}``. The
``type`` is "BadRequestError"/"NotFoundError"/... for errors its handlers raise, but the
HTTP status phrase ("Bad Request") for body validation, which FastAPI does. Routing errors
(unknown path, wrong method) are FastAPI's own ``{"detail": ...}``, not the OpenAI shape.
Clients that branch on any of this must see the same words from us.
"""

from __future__ import annotations

from http import HTTPStatus

import orjson


class ApiError(Exception):
    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        err_type: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type
        self.param = param
        self.headers: list[tuple[bytes, bytes]] = []

    def body(self) -> bytes:
        return error_body(self.message, self.err_type, self.status, self.param)


class RouteError(ApiError):
    """FastAPI's routing failure: ``{"detail": "Not Found"}``, plus ``allow`` on a 405."""

    def __init__(self, status: HTTPStatus, allow: str | None = None) -> None:
        super().__init__(status.phrase, status=status.value, err_type=status.phrase)
        if allow is not None:
            self.headers.append((b"allow", allow.encode()))

    def body(self) -> bytes:
        return orjson.dumps({"detail": self.message})


def error_body(message: str, err_type: str, status: int, param: str | None = None) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    )


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(message, param=param)


def vllm_validation(message: str, param: str | None = None, value: object = None) -> ApiError:
    """A VLLMValidationError: its text ends with the parameter and value, as vLLM prints it."""
    extras = []
    if param is not None:
        extras.append(f"parameter={param}")
    if value is not None:
        extras.append(f"value={value}")
    text = f"{message} ({', '.join(extras)})" if extras else message
    return bad_request(text, param=param)


MAX_REPORTED_ERRORS = 10


def validation_error(*errors: str, param: str | None = None) -> ApiError:
    """FastAPI's request-validation failure, as vLLM's handler words it (ten at most)."""
    count = len(errors)
    label = "error" if count == 1 else "errors"
    shown = errors[:MAX_REPORTED_ERRORS]
    message = f"{count} validation {label}:\n" + "".join(f"  {e}\n" for e in shown)
    if count > len(shown):
        message += f"  ...and {count - len(shown)} more {label}\n"
    return ApiError(message.rstrip(), err_type=HTTPStatus.BAD_REQUEST.phrase, param=param)


def model_not_found(requested: str, served: tuple[str, ...] | None) -> ApiError:
    """Generation endpoints list the valid names; pooling endpoints (``served=None``) do not."""
    if served is None:
        return ApiError(
            f"The model `{requested}` does not exist.",
            status=HTTPStatus.NOT_FOUND.value,
            err_type="NotFoundError",
        )
    return ApiError(
        f"The model `{requested}` does not exist. Valid aliases: {', '.join(served)}.",
        status=HTTPStatus.NOT_FOUND.value,
        err_type="NotFoundError",
        param="model",
    )


def internal_error(message: str) -> ApiError:
    return ApiError(
        message,
        status=HTTPStatus.INTERNAL_SERVER_ERROR.value,
        err_type="InternalServerError",
    )
