"""Valkey's clock, read locally: the one clock every time the scheduling scripts compare.

Fleet entries are stamped by the watcher's host and read by every gateway's; heartbeats are
written by one gateway and judged by another's reaper. Each host's own wall clock would make
their skew part of every comparison (0.6 s of it made every replica look stale under a 1 s
bound). So every process measures, with Valkey's ``TIME``, how far Valkey's clock is from
its own monotonic clock, and reads time as ``monotonic + offset``: only Valkey's clock then
matters, and a local wall clock that is off, or steps, changes nothing.

The offset is taken from the round trip's midpoint, so it is off by at most half a round
trip (well under a millisecond on a LAN); it is re-measured every time ``sync`` is called
(each gateway's heartbeat, each watcher cycle), which also absorbs the slow drift of the
monotonic clock. Until the first ``sync`` succeeds, the local wall clock stands in.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any


class ValkeyClock:
    """``clock()`` → Valkey's time in ms, without a round trip; ``await clock.sync(...)``."""

    __slots__ = ("_offset_ms", "synced")

    def __init__(self) -> None:
        # Until synced: the local wall clock, expressed as monotonic + offset.
        self._offset_ms = time.time() * 1000 - time.monotonic() * 1000
        self.synced = False

    def __call__(self) -> int:
        return int(time.monotonic() * 1000 + self._offset_ms)

    async def sync(self, time_command: Callable[[], Awaitable[Sequence[Any]]]) -> None:
        """Measure the offset: ``time_command`` runs Valkey's ``TIME`` (``[seconds,
        microseconds]``). Raises what it raises; the previous offset is kept then."""
        sent = time.monotonic()
        reply = await time_command()
        received = time.monotonic()
        server_ms = int(reply[0]) * 1000 + int(reply[1]) / 1000
        self._offset_ms = server_ms - (sent + received) / 2 * 1000
        self.synced = True
