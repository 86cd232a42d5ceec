"""The batcher's wait window: how long a buffer's oldest task may wait for company.

Pure functions and one small class, no I/O, so that the policy is tested on its own
(tests/scheduler/batcher/test_batcher_window.py) and read in one place (docs/async.md,
"The batcher").

The rule, with ``r`` the buffer's arrival rate (tasks/s, an EWMA of its inter-arrival
times), ``free`` the slots left in the batch, and the three settings ``min`` ≤ ``base`` ≤
``max`` (milliseconds):

- ``r · base < 1``: fewer than one more task is expected within the default window, so
  there is no one to wait for: the window is ``min``.
- ``free / r ≤ max``: the rest of the batch arrives within the bound at this rate: the window
  is the time it takes, ``clamp(1000 · free / r, min, max)``. The worker counts the window
  from the oldest task's submit and recomputes it at each arrival, so a batch leaves when its
  oldest task has waited as long as the rest of the batch would still take: no task waits
  longer for company than the company would take to come. At a steady rate that is about
  half a batch after half a batch's time; a backlog fills whole batches at once.
- otherwise the batch will not fill within ``max``: waiting longer only adds latency, so the
  window is the default ``base`` (a partial batch, its wait bounded).
"""

from __future__ import annotations

import math

# Weight of the newest inter-arrival time in the EWMA: about the last ten arrivals count.
DEFAULT_ALPHA = 0.2


class ArrivalRate:
    """An EWMA of inter-arrival times, fed the tasks' own submit times (milliseconds).

    Submit times, not read times: a batcher reads a backlog in bursts, which says nothing of
    how fast clients submit. Out-of-order times (several gateways' clocks, reclaimed
    entries) count as simultaneous arrivals."""

    __slots__ = ("_alpha", "_interval_ms", "_last_ms")

    def __init__(self, alpha: float = DEFAULT_ALPHA) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be within (0, 1]")
        self._alpha = alpha
        self._interval_ms: float | None = None
        self._last_ms: float | None = None

    def arrived(self, at_ms: float) -> None:
        last = self._last_ms
        self._last_ms = at_ms if last is None else max(last, at_ms)
        if last is None:
            return
        gap = max(at_ms - last, 0.0)
        previous = self._interval_ms
        self._interval_ms = gap if previous is None else previous + self._alpha * (gap - previous)

    def per_second(self, now_ms: float | None = None) -> float:
        """The rate; 0 before two arrivals. ``now_ms``: a silence longer than the average
        gap counts as a gap in progress, so the rate decays while nothing arrives."""
        interval = self._interval_ms
        if interval is None:
            return 0.0
        if now_ms is not None and self._last_ms is not None:
            silence = now_ms - self._last_ms
            if silence > interval:
                interval += self._alpha * (silence - interval)
        return math.inf if interval <= 0 else 1000.0 / interval


def window_ms(
    rate_per_s: float,
    free_slots: int,
    *,
    base_ms: float,
    min_ms: float,
    max_ms: float,
) -> float:
    """How long the oldest task of a buffer may wait before its batch is flushed."""
    if free_slots <= 0:
        return 0.0
    if rate_per_s * base_ms / 1000.0 < 1.0:
        return min_ms
    fill_ms = 1000.0 * free_slots / rate_per_s
    if fill_ms <= max_ms:
        return min(max(fill_ms, min_ms), max_ms)
    return min(max(base_ms, min_ms), max_ms)
