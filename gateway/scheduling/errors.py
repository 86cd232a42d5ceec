"""Why the scheduler refused a request, with a Retry-After estimated from the pool itself."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.admission.limits import Limit


class SchedulingRefused(Exception):
    """Base of the scheduler's refusals; ``status`` and ``code`` are for the HTTP answer."""

    status = 503
    code = "scheduling_refused"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class RateLimited(SchedulingRefused):
    """A rate limit would overflow (429); nothing was counted on any window.

    ``retry_after_ms`` is the time until ``limit`` has room for this request if no one else
    arrives meanwhile, or -1 when the request alone is larger than the limit (never fits).
    """

    status = 429
    code = "rate_limit_exceeded"

    def __init__(self, limit: Limit, *, retry_after_ms: int) -> None:
        self.limit = limit
        self.retry_after_ms = retry_after_ms
        # From the window itself, so not clamped like the queue's estimates: a day's limit
        # may honestly say "in nine hours".
        seconds = max(1, math.ceil(retry_after_ms / 1000))
        hint = (
            "This request alone is larger than the limit."
            if self.never_fits
            else f"Retry after {seconds}s."
        )
        super().__init__(f"Rate limit reached: {limit.name}. {hint}", retry_after_s=seconds)

    @property
    def never_fits(self) -> bool:
        return self.retry_after_ms < 0


class MaxConcurrent(SchedulingRefused):
    """The use case already has its maximum number of requests waiting or in flight (429)."""

    status = 429
    code = "max_concurrent_exceeded"


class QueueFull(SchedulingRefused):
    """The priority class's queue for this model is at its maximum length (503)."""

    code = "queue_full"


class QueueTimeout(SchedulingRefused):
    """The request waited its class's queue timeout without a grant; it left the queue (503)."""

    code = "queue_timeout"


class QueueLost(QueueTimeout):
    """The request's place in the queue is gone without a grant before its timeout (503):
    the Valkey it queued on failed over before a replica had the place, or restarted empty,
    or the reaper took this gateway for dead while it was cut off. Said at the next poll
    rather than after the whole queue timeout; the client retries (docs/valkey-ha.md)."""

    code = "queue_lost"


MAX_RETRY_AFTER_S = 3600
# The least share of the pool a class is assumed to keep while better ranks arrive as fast
# as the pool serves (or faster): such a burst does not last forever, and a Retry-After of
# an hour would keep clients away long after it ended. 5 %: at most 20 times the plain
# estimate.
MIN_SHARE = 0.05


def retry_after_s(
    *,
    ahead: int,
    hold_ms: int,
    in_flight: int,
    fallback_s: float,
    higher_rate_per_s: float = 0.0,
) -> int:
    """How long until ``ahead`` waiters (and this one) are likely through, in whole seconds.

    The pool's service rate comes from Little's law: requests in flight divided by how long
    a grant is held on average (a moving average the release script keeps). ``ahead``
    counts every waiter served before this one now (better ranks included); requests of
    better ranks keep arriving meanwhile and overtake it, so this class is served only at
    what they leave of the pool: ``service − higher_rate_per_s`` (their recent arrival
    rate), at least ``MIN_SHARE`` of it. With no history yet, ``fallback_s`` (the class's
    queue timeout) stands in.
    """
    if hold_ms < 0:
        return _clamp(fallback_s)
    per_second = max(in_flight, 1) / (max(hold_ms, 1) / 1000)
    left = max(per_second - max(higher_rate_per_s, 0.0), per_second * MIN_SHARE)
    return _clamp((ahead + 1) / left)


def _clamp(seconds: float) -> int:
    # Rounded up, but not for a float's last bits (6 / (0.5 - 0.4) is 60.000000000000014).
    return min(MAX_RETRY_AFTER_S, max(1, math.ceil(seconds - 1e-9)))
