"""Websocket routes of the web process (the live fleet view arrives with the portal screens)."""

from __future__ import annotations

from typing import Any

websocket_urlpatterns: list[Any] = []
