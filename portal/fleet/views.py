"""The live fleet page: the latest snapshot rendered at once, then the websocket's."""

from __future__ import annotations

from typing import Any

import orjson
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from portal.fleet.access import may_watch_fleet
from portal.fleet.messages import LAST_SNAPSHOT_KEY
from runtime.valkey_urls import VALKEY_FAILURES, sync_client


def _latest_snapshot() -> Any:
    client = sync_client(settings.VALKEY_URL, socket_timeout=1.0)
    try:
        raw = client.get(LAST_SNAPSHOT_KEY)
    except VALKEY_FAILURES:
        return None
    finally:
        client.close()  # type: ignore[no-untyped-call]
    return orjson.loads(raw) if isinstance(raw, bytes) else None


@login_required
@require_GET
def fleet(request: HttpRequest) -> HttpResponse:
    if not may_watch_fleet(request.user):
        raise PermissionDenied("The live fleet view is for officers, admins and auditors.")
    return render(request, "portal/fleet.html", {"snapshot": _latest_snapshot()})
