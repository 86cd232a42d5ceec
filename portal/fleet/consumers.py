"""The live fleet view's websocket: authorised like the page, then a subscriber of the
publisher's group. A new page gets the latest snapshot at once, not after the next tick."""

from __future__ import annotations

import time
from typing import Any

import orjson
import valkey
import valkey.asyncio as avalkey
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from config.env import env_float
from portal.fleet.access import may_watch_fleet, session_may_watch_fleet
from portal.fleet.messages import GROUP, LAST_SNAPSHOT_KEY, SnapshotMessage

# A websocket close code in the application range (4000-4999): 4000 + HTTP's 403.
FORBIDDEN = 4403
# How often an open socket's session is checked again (one query per socket, not per tick).
RECHECK_S = env_float("SWITCHYARD_FLEET_RECHECK_SECONDS", 30.0, minimum=0.1)


class FleetConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
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
        await self.channel_layer.group_add(GROUP, self.channel_name)
        latest = await _latest_snapshot()
        if latest is not None:
            await self.send_json(latest)

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(GROUP, self.channel_name)

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
    client = avalkey.Valkey.from_url(settings.VALKEY_URL)
    try:
        raw = await client.get(LAST_SNAPSHOT_KEY)
    except (valkey.ValkeyError, OSError):
        return None
    finally:
        await client.aclose()
    return orjson.loads(raw) if raw else None
