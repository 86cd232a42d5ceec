"""Rate limits: which apply to a request and what it costs on them (docs/gateway-scheduling.md).

Pure functions over the policy snapshot; the counting happens in Valkey inside the
scheduler's acquire.lua (limits first, then the queue, in one atomic call) and the tokens are
reconciled by its release.lua::

    tokens = estimate_tokens(prompt_chars=..., max_tokens=body.get("max_tokens"),
                             model_max_tokens=model.max_tokens)
    limits = limits_for(policy, principal, model.public_id, tokens)
    ticket = ticket_for(policy, principal, model, ..., limits=limits)
    grant = await scheduler.acquire(ticket)      # RateLimited: 429 naming refused.limit.name
    ...
    scheduler.release_nowait(grant, reconcile=reconcile_args(
        limits, admitted_ms=grant.admitted_ms, actual_tokens=usage.total_tokens))

A refused request consumes nothing on any window. Only token windows are reconciled.
"""

from gateway.admission.limits import (
    DAY_MS,
    DEFAULT_COMPLETION_ESTIMATE,
    MINUTE_MS,
    Limit,
    LimitKind,
    estimate_prompt_tokens,
    estimate_tokens,
    estimated_tokens,
    limit_args,
    limits_for,
    reconcile_args,
)

__all__ = [
    "DAY_MS",
    "DEFAULT_COMPLETION_ESTIMATE",
    "MINUTE_MS",
    "Limit",
    "LimitKind",
    "estimate_prompt_tokens",
    "estimate_tokens",
    "estimated_tokens",
    "limit_args",
    "limits_for",
    "reconcile_args",
]
