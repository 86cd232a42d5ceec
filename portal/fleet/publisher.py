"""``python -m portal.fleet.publisher``: the one process that reads the fleet once a second
and fans the picture out to every open live page through the Channels layer.

One reader for any number of pages: the pages' websockets never touch the scheduling keys,
so a hundred open tabs cost Valkey what one does.

Valkey away (docs/portal.md "Live fleet view through a Valkey outage"): the fleet cannot be
read and, the Channels layer being Valkey too, nothing can be sent; the process keeps
running, logs the outage once (``fleet_valkey_unavailable``) and each retry with its next wait,
and tries again with backoff (the interval doubling up to ``MAX_BACKOFF_S``) so that a long
outage costs one connection attempt every few seconds. The first tick that gets through
logs ``fleet_valkey_recovered`` and publishes at once; its rates are counted from then, not
over the outage. The pages learn of the outage from their own consumer, not from here.
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
from runtime.env import env_float
from runtime.valkey_urls import VALKEY_FAILURES, async_client

_FAILED_OR_TIMED_OUT: tuple[type[BaseException], ...] = (*VALKEY_FAILURES, TimeoutError)

logger = logging.getLogger("portal.fleet.publisher")

INTERVAL_S = 1.0
MAX_BACKOFF_S = 5.0  # the longest wait between two tries while Valkey is away
# A read or a send that takes longer than this counts as Valkey away (a hung server, a
# partition): the loop must not stall on it.
CALL_TIMEOUT_S = 2.0


def backoff_s(failures: int, interval_s: float) -> float:
    """The wait before the next try after ``failures`` failed ticks in a row."""
    if failures <= 0:
        return interval_s
    return float(min(interval_s * 2 ** (failures - 1), max(MAX_BACKOFF_S, interval_s)))


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
    client = async_client(
        settings.VALKEY_URL, socket_timeout=CALL_TIMEOUT_S, socket_connect_timeout=CALL_TIMEOUT_S
    )
    reader = FleetReader(client)
    leadership = Leadership(client, ttl_ms=max(int(interval_s * 3000), 1000))
    leading = False
    failures = 0  # ticks in a row that could not reach Valkey
    down_since = 0.0
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
                    snapshot = await asyncio.wait_for(reader.read(), CALL_TIMEOUT_S)
                    await asyncio.wait_for(publish(client, snapshot), CALL_TIMEOUT_S)
                elif leading:
                    leading = False
                    logger.info("fleet_publisher_standby")
                if failures:
                    logger.info(
                        "fleet_valkey_recovered after_s=%.1f failed_ticks=%d",
                        time.monotonic() - down_since,
                        failures,
                    )
                    failures = 0
            except _FAILED_OR_TIMED_OUT as exc:
                # Valkey away: the pages say so (their consumers see it); try again later.
                if not failures:
                    down_since = started
                    logger.warning("fleet_valkey_unavailable error=%s", exc.__class__.__name__)
                failures += 1
                leading = False  # a restarted Valkey has no lease: take it again, rates anew
                logger.info(
                    "fleet_publish_retry failures=%d retry_in_s=%.2f",
                    failures,
                    backoff_s(failures, interval_s),
                )
            except (ValueError, KeyError, TypeError):
                logger.exception("fleet_publish_failed")
            delay = max(backoff_s(failures, interval_s) - (time.monotonic() - started), 0.0)
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
