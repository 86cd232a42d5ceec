"""Why the scheduler refused a request, with a Retry-After estimated from the pool itself."""

from __future__ import annotations

import math


class SchedulingRefused(Exception):
    """Base of the scheduler's refusals; ``status`` and ``code`` are for the HTTP answer."""

    status = 503
    code = "scheduling_refused"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class MaxConcurrent(SchedulingRefused):
    """The use case already has its maximum number of requests in flight (429)."""

    status = 429
    code = "max_concurrent_exceeded"


class QueueFull(SchedulingRefused):
    """The priority class's queue for this model is at its maximum length (503)."""

    code = "queue_full"


class QueueTimeout(SchedulingRefused):
    """The request waited its class's queue timeout without a grant; it left the queue (503)."""

    code = "queue_timeout"


MAX_RETRY_AFTER_S = 3600


def retry_after_s(*, ahead: int, hold_ms: int, in_flight: int, fallback_s: float) -> int:
    """How long until ``ahead`` waiters (and this one) are likely through, in whole seconds.

    The pool's service rate comes from Little's law: requests in flight divided by how long
    a grant is held on average (a moving average the release script keeps). With no
    history yet, ``fallback_s`` (the class's queue timeout) stands in.
    """
    if hold_ms < 0:
        return _clamp(fallback_s)
    per_second = max(in_flight, 1) / (max(hold_ms, 1) / 1000)
    return _clamp((ahead + 1) / per_second)


def _clamp(seconds: float) -> int:
    return min(MAX_RETRY_AFTER_S, max(1, math.ceil(seconds)))
