"""The live fleet view's websocket: authorised like the page, then a subscriber of the
publisher's group. A new page gets the latest snapshot at once, not after the next tick.

The group lives in the Channels layer, which is Valkey. While Valkey is away the socket stays
open: the consumer tells its page once that the data is unavailable, then tries to join the
group again with backoff; once it can, it says so and sends the latest snapshot, and the
page is live again without a reload (docs/portal.md "Live fleet view through a Valkey
outage")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import valkey
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from portal.fleet.access import may_watch_fleet, session_may_watch_fleet
from portal.fleet.messages import (
    AVAILABLE_TYPE,
    GROUP,
    LAST_SNAPSHOT_KEY,
    UNAVAILABLE_TYPE,
    LayerMessage,
    SnapshotMessage,
    StatusMessage,
)
from runtime.env import env_float
from runtime.valkey_urls import VALKEY_FAILURES, async_client

logger = logging.getLogger("portal.fleet.consumers")

# A websocket close code in the application range (4000-4999): 4000 + HTTP's 403.
FORBIDDEN = 4403
# How often an open socket's session is checked again (one query per socket, not per tick).
RECHECK_S = env_float("SWITCHYARD_FLEET_RECHECK_SECONDS", 30.0, minimum=0.1)
# Rejoining the group while Valkey is away: from the first wait, doubling to the last.
REJOIN_FIRST_S = 0.25
REJOIN_MAX_S = env_float("SWITCHYARD_FLEET_REJOIN_MAX_SECONDS", 5.0, minimum=0.1)
_VALKEY_AWAY = (valkey.ValkeyError, OSError)
UNAVAILABLE_DETAIL = "The portal cannot reach Valkey, where the fleet's figures live."


class FleetConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    layer_down = False  # the last layer call failed: the group is to be joined again
    watching = False  # accepted and authorised: status messages may be sent

    # Channels' AsyncConsumer.__call__ assigns the layer's receive to ``channel_receive`` and
    # awaits it in its dispatch loop, where a failure would end the socket (close 1011) and
    # send the page into a reconnect loop that cannot succeed while Valkey is away. Keeping
    # the layer's receive aside and answering with our own turns the failure into events.
    @property
    def channel_receive(self) -> Callable[[], Awaitable[Any]]:
        return self._receive_from_layer

    @channel_receive.setter
    def channel_receive(self, receive: Callable[[], Awaitable[Any]]) -> None:
        self._layer_receive = receive

    async def _receive_from_layer(self) -> Any:
        """The layer's next message; when a layer call fails, one ``fleet.unavailable``
        event, then tries to rejoin the group with backoff until one succeeds, then one
        ``fleet.available`` event."""
        delay = REJOIN_FIRST_S
        while True:
            if not self.layer_down:
                try:
                    return await self._layer_receive()
                except _VALKEY_AWAY as exc:
                    self.layer_down = True
                    logger.warning("fleet_layer_unavailable error=%s", exc.__class__.__name__)
                    unavailable: LayerMessage = {"type": UNAVAILABLE_TYPE}
                    return unavailable
            await asyncio.sleep(delay)
            delay = min(delay * 2, REJOIN_MAX_S)
            if not self.watching:
                continue  # refused or not yet accepted: nothing to rejoin
            try:
                await self.channel_layer.group_add(GROUP, self.channel_name)
            except _VALKEY_AWAY:
                continue
            self.layer_down = False
            logger.info("fleet_layer_available")
            available: LayerMessage = {"type": AVAILABLE_TYPE}
            return available

    async def _send_status(self, status: StatusMessage) -> None:
        await self.send_json(status)

    async def connect(self) -> None:
        user = self.scope.get("user")
        allowed = user is not None and await database_sync_to_async(may_watch_fleet)(user)
        session = self.scope.get("session")
        self.session_key: str | None = getattr(session, "session_key", None)
        self.checked_at = time.monotonic()
        # Accepted, then closed with a code the page can read: a refusal before accepting
        # is an HTTP 403 the browser does not tell the script apart from a network error.
        await self.accept()
        if not allowed:
            await self.close(code=FORBIDDEN)
            return
        self.watching = True
        try:
            await self.channel_layer.group_add(GROUP, self.channel_name)
        except _VALKEY_AWAY:
            self.layer_down = True  # the layer receive rejoins when Valkey is back
        if self.layer_down:
            await self._send_status({"status": "unavailable", "detail": UNAVAILABLE_DETAIL})
            return
        latest = await _latest_snapshot()
        if latest is not None:
            await self.send_json(latest)

    async def disconnect(self, code: int) -> None:
        with contextlib.suppress(*_VALKEY_AWAY):  # gone with Valkey, or expiring there
            await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def fleet_unavailable(self, message: LayerMessage) -> None:
        if self.watching:  # before connect, connect itself says it
            await self._send_status({"status": "unavailable", "detail": UNAVAILABLE_DETAIL})

    async def fleet_available(self, message: LayerMessage) -> None:
        """Back in the group: the page hears so, then gets the latest picture at once."""
        if not self.watching:
            return
        await self._send_status({"status": "available", "detail": ""})
        latest = await _latest_snapshot()
        if latest is not None:
            await self.send_json(latest)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The page only listens."""

    async def fleet_snapshot(self, message: SnapshotMessage) -> None:
        if time.monotonic() - self.checked_at >= RECHECK_S:
            self.checked_at = time.monotonic()
            if not await database_sync_to_async(session_may_watch_fleet)(self.session_key):
                await self.channel_layer.group_discard(GROUP, self.channel_name)
                await self.close(code=FORBIDDEN)
                return
        await self.send_json(message["snapshot"])

    @classmethod
    async def encode_json(cls, content: Any) -> str:
        return orjson.dumps(content).decode()


async def _latest_snapshot() -> Any:
    client = async_client(settings.VALKEY_URL, socket_timeout=2.0, socket_connect_timeout=2.0)
    try:
        raw = await client.get(LAST_SNAPSHOT_KEY)
    except VALKEY_FAILURES:
        return None
    finally:
        await client.aclose()
    return orjson.loads(raw) if raw else None
