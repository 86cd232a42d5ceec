"""Rate limits: the first half of admitting a request (docs/gateway-scheduling.md).

How the request path uses it::

    limiter = RateLimiter(valkey_client)                      # once per process
    tokens = estimate_tokens(prompt_chars=..., max_tokens=body.get("max_tokens"),
                             model_max_tokens=model.max_tokens)
    admission = await limiter.admit(
        limits_for(policy, principal, model.public_id, tokens), now_ms=now_ms()
    )
    if not admission.ok:
        # 429, code "rate_limit_exceeded", Retry-After: admission.retry_after_s,
        # message naming admission.refused.name (e.g. "tenant acme tokens per minute");
        # admission.never_fits: the request alone is larger than that limit.
        ...
    ...  # schedule, forward
    await limiter.reconcile(admission, actual_tokens=usage.total_tokens, now_ms=now_ms())

A refused request consumes nothing on any window. Only token windows are reconciled.
"""

from gateway.admission.limiter import Admission, RateLimiter
from gateway.admission.limits import (
    DAY_MS,
    DEFAULT_COMPLETION_ESTIMATE,
    MINUTE_MS,
    Limit,
    LimitKind,
    estimate_tokens,
    limits_for,
)

__all__ = [
    "DAY_MS",
    "DEFAULT_COMPLETION_ESTIMATE",
    "MINUTE_MS",
    "Admission",
    "Limit",
    "LimitKind",
    "RateLimiter",
    "estimate_tokens",
    "limits_for",
]
