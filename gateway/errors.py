"""Every gateway failure as an exception, rendered in OpenAI's error shape in one place.

OpenAI SDKs map the status code to an exception class (401 AuthenticationError, 403
PermissionDeniedError, 404 NotFoundError, 429 RateLimitError, ≥500 InternalServerError) and
read ``error.message``/``error.type``/``error.code``, so both must be right.
"""

from __future__ import annotations

from typing import Any

import orjson


class GatewayError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or []

    def error(self) -> dict[str, Any]:
        """OpenAI's error object: what a response's ``error`` (or an async task's) says."""
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}

    def body(self) -> bytes:
        return orjson.dumps({"error": self.error()})


def missing_key() -> GatewayError:
    return GatewayError(
        401,
        "You didn't provide an API key. Send it in an Authorization header using Bearer auth "
        "(Authorization: Bearer YOUR_KEY).",
        code="missing_api_key",
    )


def invalid_key() -> GatewayError:
    # Never echo any part of the presented key: it may be a real key of another system.
    return GatewayError(401, "Incorrect API key provided.", code="invalid_api_key")


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def not_found(message: str, *, code: str = "not_found") -> GatewayError:
    return GatewayError(404, message, code=code)


def service_unavailable(message: str, *, code: str, retry_after_s: int = 1) -> GatewayError:
    return GatewayError(
        503,
        message,
        type="service_unavailable",
        code=code,
        headers=[(b"retry-after", str(retry_after_s).encode())],
    )


def use_case_not_approved(use_case: str) -> GatewayError:
    """Work a use case asked for while it was approved, refused once an officer suspended or
    retired it (an async task read after the fact): not run, and said so."""
    return GatewayError(
        403,
        f"Use case {use_case} is not approved any more (suspended or retired): the task was "
        "not run.",
        type="permission_error",
        code="use_case_not_approved",
    )
