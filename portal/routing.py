"""Websocket routes of the web process."""

from __future__ import annotations

from typing import Any

from django.urls import path

from portal.fleet.consumers import FleetConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/fleet/", FleetConsumer.as_asgi()),
]
