"""File jobs call the fleet through the gateway, as their use case, at their SLA's class.

Never around it: a job's calls carry the job key of its SLA class (governance/job_keys.py),
so the gateway admits, queues, limits and records them like any client's, at the priority
class the officer gave that SLA class, and interactive traffic keeps its precedence. A
registration with an explicit deadline and no SLA class uses its use case's default job key,
which runs at the lowest-ranked priority class.

Errors are mapped in this one place: 429/503 and connection failures may pass (``Retryable``,
honouring ``Retry-After``), 5xx from a replica too; any other 4xx is the input's fault
(``PartFailed`` with the gateway's own message).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests

from scheduler.files.pipelines.base import PartFailed, RequestRefused, Retryable

CONNECT_TIMEOUT = 5.0
_MAX_MESSAGE = 300


class GatewayClient:
    """``pipelines.base.GatewayCaller`` over one pooled ``requests`` session (thread-safe for
    the part pool's concurrent posts: each call takes its own pooled connection)."""

    def __init__(self, base_url: str, key: str, *, timeout: float = 300.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = (CONNECT_TIMEOUT, timeout)
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {key}"
        adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=16)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)

    def close(self) -> None:
        self.session.close()

    def post_json(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._post(path, json=dict(body))

    def post_multipart(
        self, path: str, fields: Mapping[str, str], file_name: str, content: bytes, mime: str
    ) -> dict[str, Any]:
        return self._post(path, data=dict(fields), files={"file": (file_name, content, mime)})

    def _post(self, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            answer = self.session.post(self.base_url + path, timeout=self.timeout, **kwargs)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise Retryable(f"the gateway did not answer: {type(exc).__name__}") from exc
        if answer.status_code < 400:
            try:
                decoded = answer.json()
            except ValueError as exc:
                raise Retryable(f"the gateway answered {path} with no JSON") from exc
            if not isinstance(decoded, dict):
                raise PartFailed(f"the gateway answered {path} with JSON that is not an object")
            return decoded
        message = error_message(answer)
        if answer.status_code in (429, 503) or answer.status_code >= 500:
            raise Retryable(
                f"{path}: {answer.status_code} {message}",
                retry_after=retry_after(answer.headers.get("Retry-After")),
            )
        try:
            body: object = answer.json()
        except ValueError:
            body = {"error": {"message": message}}
        raise RequestRefused(
            f"{path}: {answer.status_code} {message}",
            status_code=answer.status_code,
            body=body,
            request_id=answer.headers.get("x-request-id", ""),
        )


def retry_after(value: str | None, default: float = 1.0) -> float:
    """Seconds from a ``Retry-After`` header (delta-seconds only; a date falls back)."""
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        return default


def error_message(answer: requests.Response) -> str:
    """The gateway's OpenAI-shaped ``error.message``, else the start of the body."""
    try:
        body = answer.json()
    except ValueError:
        return answer.text[:_MAX_MESSAGE]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:_MAX_MESSAGE]
        if isinstance(body.get("detail"), str):
            return str(body["detail"])[:_MAX_MESSAGE]
    return answer.text[:_MAX_MESSAGE]
