"""The web process's probes, answered before Django: ``/healthz`` and ``/readyz``.

Kubernetes probes a pod by its IP, which no ``ALLOWED_HOSTS`` lists, so Django itself would
answer them 400; these two paths are answered here, ahead of Django's host check, and say
nothing but "ok" or which dependency is down. ``/healthz`` (liveness): the process and its
event loop answer. ``/readyz`` (readiness): the database answers a query too — a web process
that cannot reach it can serve nothing, so the Service stops sending it visitors.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connection

LIVENESS_PATH = "/healthz"
READINESS_PATH = "/readyz"

Scope = dict[str, Any]
Message = dict[str, Any]


def _database_answers() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except DatabaseError:
        return False
    finally:
        # Probe threads come and go: leave no connection behind in this one.
        connection.close()


class HealthEndpoints:
    """ASGI middleware: the two probe paths, then the wrapped application."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or path not in (LIVENESS_PATH, READINESS_PATH):
            await self.app(scope, receive, send)
            return
        status, body = 200, b"ok\n"
        if path == READINESS_PATH and not await sync_to_async(_database_answers)():
            status, body = 503, b"database unreachable\n"
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"cache-control", b"no-store")],
            }
        )
        await send({"type": "http.response.body", "body": body})
