"""The fleet hash the scheduling scripts read: one entry per replica, written by the watcher.

A replica counts as having room only while its entry is fresh (``now - scraped_at_ms`` at
most the scheduler's ``stale_ms``) and vLLM's own queue is below the waiting threshold; a
replica without an entry, or with a stale one, is saturated. vLLM's queue counts the grants
and releases made since the scrape when the entry carries the in-flight count at scrape
time, and a learned batch size lowers the cap (common.lua ``load_room``). The watcher writes
an unreachable replica as saturated, and calls ``Scheduler.pump(model)`` when a replica's
waiting count drops below the threshold.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import cast

import valkey.asyncio as avalkey

from gateway.scheduling import keys


def fleet_entry(
    *,
    waiting: int,
    running: int,
    kv_usage: float,
    scraped_at_ms: int,
    in_flight: int | None = None,
    max_running: int = 0,
) -> str:
    """``waiting|running|kv_usage|scraped_at_ms``, then ``|in_flight|max_running`` when
    either is known: the pool's requests in flight on the replica when its scrape began
    (grants and releases since move its queue), and its batch size as the watcher learned
    it (0: not yet)."""
    entry = f"{waiting}|{running}|{kv_usage:.4f}|{scraped_at_ms}"
    if in_flight is None and max_running <= 0:
        return entry
    return f"{entry}|{'' if in_flight is None else in_flight}|{max(max_running, 0)}"


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
