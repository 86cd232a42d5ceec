"""The fleet hash the scheduling scripts read: one entry per replica, written by the watcher.

A replica counts as having room only while its entry is fresh (``now - scraped_at_ms`` at
most the scheduler's ``stale_ms``) and vLLM's own queue is below the waiting threshold; a
replica without an entry, or with a stale one, is saturated. The watcher writes an
unreachable replica as saturated, and calls ``Scheduler.pump(model)`` when a replica's
waiting count drops below the threshold.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import cast

import valkey.asyncio as avalkey

from gateway.scheduling import keys


def fleet_entry(*, waiting: int, running: int, kv_usage: float, scraped_at_ms: int) -> str:
    return f"{waiting}|{running}|{kv_usage:.4f}|{scraped_at_ms}"


def saturated_entry(*, scraped_at_ms: int, waiting: int = 1_000_000) -> str:
    """What to write for a replica that did not answer its scrape."""
    return fleet_entry(waiting=waiting, running=0, kv_usage=1.0, scraped_at_ms=scraped_at_ms)


async def write_fleet(
    client: avalkey.Valkey,
    model: str,
    entries: Mapping[str, str],
    *,
    prefix: str = keys.KEY_PREFIX,
) -> None:
    if entries:
        written = client.hset(keys.fleet(model, prefix=prefix), mapping=dict(entries))
        await cast(Awaitable[int], written)
