"""The Valkey key layout of admission and scheduling (docs/gateway-scheduling.md).

The Lua scripts build these names themselves from the prefix they receive as KEYS[1]; the
Python helpers here are for the code around them (the fleet watcher, tests, operators).
Every key carries the hash tag ``{sy}`` so that, in a Valkey Cluster, all of them share one
slot and one script may touch any of them.
"""

from __future__ import annotations

KEY_PREFIX = "sy:{sy}:"
GATEWAY_CHANNEL_PREFIX = "sy:gw:"

# Scores in a pool's queue are rank * 2**40 + virtual start, exact in a double while the rank
# stays below 2**12 and the virtual start below 2**40 (the scripts rebase it well before).
RANK_SCALE = 2**40
MAX_RANK = 2**12 - 1


def queue(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}q:{model}"


def waiter(request_id: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}qi:{request_id}"


def queue_length(model: str, priority_class: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}qlen:{model}:{priority_class}"


def queue_deadlines(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}qdl:{model}"


def virtual_time(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}vt:{model}"


def in_flight(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}inflight:{model}"


def leases(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}lease:{model}"


def lease(request_id: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}li:{request_id}"


def concurrency(use_case_id: str | int, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}conc:{use_case_id}"


def grant(request_id: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}grant:{request_id}"


def fleet(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}fleet:{model}"


def pool(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}pool:{model}"


def service(model: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}svc:{model}"


def pools(*, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}pools"


def affinity(model: str, prefix_hash: str, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}aff:{model}:{prefix_hash}"


def long_prompts(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """Replica -> long prompts in flight on it (pools with lanes, common.lua pick)."""
    return f"{prefix}lng:{model}"


def drain(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """The replica kept free of new interactive requests for a waiting long prompt."""
    return f"{prefix}drn:{model}"


def background(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """Replica -> requests of classes with a pool share in flight on it (pools with lanes)."""
    return f"{prefix}bgi:{model}"


def gateways(*, prefix: str = KEY_PREFIX) -> str:
    """Zset: gateway id -> heartbeat expiry (ms). Missing or past: the gateway is dead."""
    return f"{prefix}gws"


def arrivals(model: str, window_index: int, *, prefix: str = KEY_PREFIX) -> str:
    """Hash: rank -> requests enqueued during that window (Retry-After's demand estimate)."""
    return f"{prefix}arr:{model}:{window_index}"


def rate_window(limit_id: str, window_index: int, *, prefix: str = KEY_PREFIX) -> str:
    return f"{prefix}rl:{limit_id}:{window_index}"


def gateway_channel(gateway_id: str) -> str:
    return f"{GATEWAY_CHANNEL_PREFIX}{gateway_id}"


def throughput(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """The model's measured tokens per second (fleet watcher), read by the feasibility model."""
    return f"{prefix}throughput:{model}"


def promises(model: str, *, prefix: str = KEY_PREFIX) -> str:
    """The model's ledger of file-work promises (scheduler/feasibility.py)."""
    return f"{prefix}promises:{model}"
