"""Priority, fairness, capacity and leases for model pools (docs/gateway-scheduling.md).

How the request path uses it (the rate limits are checked and counted by acquire)::

    scheduler = Scheduler(valkey_client, lease_ms=30_000)     # once per process
    await scheduler.start()                                   # at startup; close() at shutdown

    ticket = ticket_for(policy, principal, model, request_id=request_id, cost=tokens,
                        prefix_hash=prefix_hash(prompt_start), limits=limits_for(...))
    try:
        async with scheduler.hold(ticket) as grant:          # acquire, renew, always release
            body["priority"] = grant.vllm_priority           # vLLM: lower is served earlier
            ...  # forward to grant.replica, stream the answer
    except (RateLimited, MaxConcurrent) as refused:          # 429
        ...  # Retry-After: refused.retry_after_s, error.code = refused.code
    except (QueueFull, QueueTimeout) as refused:             # 503
        ...

``acquire`` is cancellation-safe: run it in a task that is cancelled when the client goes
away, and the request leaves the queue with nothing leaked. ``acquire``/``release``/
``keep_alive`` are there for code that cannot hold one ``async with`` over the request.
The fleet watcher writes replica metrics with ``write_fleet`` and calls ``Scheduler.pump``.
"""

from gateway.scheduling.errors import (
    MaxConcurrent,
    QueueFull,
    QueueLost,
    QueueTimeout,
    RateLimited,
    SchedulingRefused,
    retry_after_s,
)
from gateway.scheduling.fleet import fleet_entry, saturated_entry, write_fleet
from gateway.scheduling.scheduler import SCRIPT_NAMES, Scheduler, lua_source, wall_ms
from gateway.scheduling.tickets import (
    UNCLASSIFIED,
    Grant,
    Ticket,
    TicketPlan,
    TicketPlans,
    prefix_hash,
    priority_class_for,
    ticket_for,
)

__all__ = [
    "SCRIPT_NAMES",
    "UNCLASSIFIED",
    "Grant",
    "MaxConcurrent",
    "QueueFull",
    "QueueLost",
    "QueueTimeout",
    "RateLimited",
    "Scheduler",
    "SchedulingRefused",
    "Ticket",
    "TicketPlan",
    "TicketPlans",
    "fleet_entry",
    "lua_source",
    "prefix_hash",
    "priority_class_for",
    "retry_after_s",
    "saturated_entry",
    "ticket_for",
    "wall_ms",
    "write_fleet",
]
