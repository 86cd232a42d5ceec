"""The Valkey key layout of admission and scheduling (docs/gateway-scheduling.md).

The Lua scripts build these names themselves from the prefixes they receive as KEYS; the
Python helpers here are for the code around them (the fleet watcher, tests, operators).

Three kinds of slot (hash tag), so that admission can spread over a Valkey Cluster's shards
(docs/gateway-scheduling.md, "Scale-out"):

- a model pool's slot, ``sy:{sy/<model>}:``: its queue, waiters, leases, in-flight counts,
  fleet view, lanes and the limits that live in one pool (model, tenant × model);
- a tenant's slot, ``sy:{sy/@<tenant>}:``: the limits that span pools (tenant, use case) and
  the use cases' max-concurrent counts ("@" is not allowed in a model id, so the two never
  meet);
- the shared slot, ``sy:{sy}:``: the global limit, the registry of pools, the fleet
  watcher's heartbeat.
"""

from __future__ import annotations

from gateway.slots import KEY_PREFIX, account_prefix, pool_prefix, rate_limit

__all__ = ["KEY_PREFIX", "account_prefix", "pool_prefix", "rate_limit"]
GATEWAY_CHANNEL_PREFIX = "sy:gw:"

# Scores in a pool's queue are rank * 2**40 + virtual start, exact in a double while the rank
# stays below 2**12 and the virtual start below 2**40 (the scripts rebase it well before).
RANK_SCALE = 2**40
MAX_RANK = 2**12 - 1


def queue(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{pool_prefix(model, prefix=prefix)}q:{model}"


def waiter(request_id: str, model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{pool_prefix(model, prefix=prefix)}qi:{request_id}"


def queue_length(model: str, priority_class: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{pool_prefix(model, prefix=prefix)}qlen:{model}:{priority_class}"


def queue_deadlines(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{pool_prefix(model, prefix=prefix)}qdl:{model}"


def virtual_time(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{pool_prefix(model, prefix=prefix)}vt:{model}"


def in_flight(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{pool_prefix(model, prefix=prefix)}inflight:{model}"


def leases(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{pool_prefix(model, prefix=prefix)}lease:{model}"


def lease(request_id: str, model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{pool_prefix(model, prefix=prefix)}li:{request_id}"


def concurrency(tenant: str, use_case_id: str | int, *, prefix: str = KEY_PREFIX) -> str:
    """The use case's requests waiting or in flight (max concurrent), on its tenant's slot."""
    return f"{account_prefix(tenant, prefix=prefix)}conc:{use_case_id}"


def grant(request_id: str, model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{pool_prefix(model, prefix=prefix)}grant:{request_id}"


def fleet(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{pool_prefix(model, prefix=prefix)}fleet:{model}"


def pool(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{pool_prefix(model, prefix=prefix)}pool:{model}"


def service(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{pool_prefix(model, prefix=prefix)}svc:{model}"


def pools(*, prefix: str = KEY_PREFIX) -> str:
    """Set: models whose pool a gateway has used (the reapers' list, on the shared slot)."""
    return f"{prefix}pools"


def affinity(model: str, prefix_hash: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{pool_prefix(model, prefix=prefix)}aff:{model}:{prefix_hash}"


def long_prompts(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """Replica -> long prompts in flight on it (pools with lanes, common.lua pick)."""
    return f"{pool_prefix(model, prefix=prefix)}lng:{model}"


def drain(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """The replica kept free of new interactive requests for a waiting long prompt."""
    return f"{pool_prefix(model, prefix=prefix)}drn:{model}"


def background(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """Replica -> requests of classes with a pool share in flight on it (pools with lanes)."""
    return f"{pool_prefix(model, prefix=prefix)}bgi:{model}"


def gateways(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """Zset: gateway id -> heartbeat expiry (ms), in a pool's slot (each gateway writes it
    to the pools it has used). Missing or past: the gateway is dead."""
    return f"{pool_prefix(model, prefix=prefix)}gws"


def pool_members(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """Set, in a pool's slot: the pool's own model (what reap.lua walks there)."""
    return f"{pool_prefix(model, prefix=prefix)}pools"


def arrivals(model: str, window_index: int, *, prefix: str = KEY_PREFIX) -> str:
    """Hash: rank -> requests enqueued during that window (Retry-After's demand estimate)."""
    return f"{pool_prefix(model, prefix=prefix)}arr:{model}:{window_index}"


def rate_window(stem: str, window_index: int) -> str:
    """One fixed window of a limit whose stem is ``stem`` (``Limit.stem``)."""
    return f"{stem}:{window_index}"


def gateway_channel(gateway_id: str) -> str:
    return f"{GATEWAY_CHANNEL_PREFIX}{gateway_id}"


def throughput(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """The model's measured tokens per second (fleet watcher), read by the feasibility model."""
    return f"{prefix}throughput:{model}"


def promises(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """The model's ledger of file-work promises (scheduler/files/feasibility.py)."""
    return f"{prefix}promises:{model}"
