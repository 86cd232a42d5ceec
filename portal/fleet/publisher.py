"""``python -m portal.fleet.publisher``: the one process that reads the fleet once a second
and fans the picture out to every open live page through the Channels layer.

One reader for any number of pages: the pages' websockets never touch the scheduling keys,
so a hundred open tabs cost Valkey what one does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time

import orjson
import valkey
import valkey.asyncio as avalkey

from config.env import env_float
from portal.fleet.leader import Leadership
from portal.fleet.messages import (
    GROUP,
    LAST_SNAPSHOT_KEY,
    LAST_SNAPSHOT_TTL_S,
    SNAPSHOT_TYPE,
    FleetSnapshot,
    SnapshotMessage,
)
from portal.fleet.reader import FleetReader

logger = logging.getLogger("portal.fleet.publisher")

INTERVAL_S = 1.0


async def publish(client: avalkey.Valkey, snapshot: FleetSnapshot) -> None:
    """Keep the snapshot for pages that connect before the next tick, then fan it out."""
    from channels.layers import get_channel_layer

    await client.set(LAST_SNAPSHOT_KEY, orjson.dumps(snapshot), ex=LAST_SNAPSHOT_TTL_S)
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("CHANNEL_LAYERS is not configured")
    message: SnapshotMessage = {"type": SNAPSHOT_TYPE, "snapshot": snapshot}
    await layer.group_send(GROUP, dict(message))


async def run(*, interval_s: float = INTERVAL_S, stop: asyncio.Event | None = None) -> None:
    from django.conf import settings

    stop = stop or asyncio.Event()
    client = avalkey.Valkey.from_url(settings.VALKEY_URL)
    reader = FleetReader(client)
    leadership = Leadership(client, ttl_ms=max(int(interval_s * 3000), 1000))
    leading = False
    logger.info("fleet_publisher_started interval_s=%s group=%s", interval_s, GROUP)
    try:
        while not stop.is_set():
            started = time.monotonic()
            try:
                if await leadership.hold():
                    if not leading:
                        logger.info("fleet_publisher_leading")
                        reader.since_ms = None  # count rates from now, not from a past tick
                    leading = True
                    snapshot = await reader.read()
                    await publish(client, snapshot)
                elif leading:
                    leading = False
                    logger.info("fleet_publisher_standby")
            except (valkey.ValkeyError, OSError) as exc:
                # Valkey away: the pages show their last picture as stale; try again.
                logger.warning("fleet_publish_failed error=%s", exc.__class__.__name__)
            except (ValueError, KeyError, TypeError):
                logger.exception("fleet_publish_failed")
            delay = max(interval_s - (time.monotonic() - started), 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
    finally:
        with contextlib.suppress(valkey.ValkeyError, OSError):
            await leadership.release()
        await client.aclose()
        logger.info("fleet_publisher_stopped")


def main() -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    interval_s = env_float("SWITCHYARD_FLEET_PUBLISH_INTERVAL_SECONDS", INTERVAL_S, minimum=0.05)

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await run(interval_s=interval_s, stop=stop)

    asyncio.run(_main())


if __name__ == "__main__":
    main()
