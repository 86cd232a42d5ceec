"""The fleet snapshot as it travels: publisher → channel layer → consumer → browser.

Sender and receivers share these types (STYLE.md, "Channels messages"): the publisher builds
a ``FleetSnapshot``, sends it to ``GROUP`` as a ``SnapshotMessage`` and keeps the latest one
under ``LAST_SNAPSHOT_KEY`` for pages that connect between two ticks.
"""

from __future__ import annotations

from typing import Final, Literal, TypedDict

GROUP: Final = "fleet"
# Kept by the publisher (with a TTL: a stopped publisher's last picture must not pass for
# live for ever); read by each new websocket and by the page's first render.
LAST_SNAPSHOT_KEY: Final = "sy:portal:fleet:last"
LAST_SNAPSHOT_TTL_S: Final = 10

SnapshotType = Literal["fleet.snapshot"]
SNAPSHOT_TYPE: Final[SnapshotType] = "fleet.snapshot"


class ReplicaRow(TypedDict):
    replica: str
    running: int | None  # None: the watcher has written nothing for it (yet)
    waiting: int | None  # vLLM's own queue; None when unknown or unreachable
    kv_usage: float | None  # 0..1
    in_flight: int  # requests the gateways granted it and have not released
    cap: int | None  # the most the scheduler sends it at once (policy cap, learned batch size)
    age_ms: int | None  # how old the watcher's scrape is
    reachable: bool
    saturated: bool  # the scheduler's own test: stale, unreachable, or queue at threshold
    full: bool  # in flight at its cap: no room even though vLLM's queue is short


class ClassRow(TypedDict):
    priority_class: str
    rank: int
    depth: int  # waiters in the model's queue (qlen:<model>:<class>)
    oldest_wait_ms: int | None  # None: nobody waits
    in_flight: int | None  # cif:<model> (only classes with a pool share below 1)


class ModelRow(TypedDict):
    model: str
    replicas: list[ReplicaRow]
    classes: list[ClassRow]
    leases: int  # lease:<model>: granted requests holding a lease
    queued: int  # q:<model>: every waiter of the pool


class Rates(TypedDict):
    admitted: float  # requests forwarded to a replica and finished (sy:usage), per second
    queued: float  # requests that waited for a grant (sy:decisions "queued"), per second
    shed: float  # dropped from the queue at their deadline, per second
    refused: float  # refused at admission (over a limit, queue full, ...), per second
    fallbacks: float  # refused by the model for capacity, served by a fallback, per second
    prompt_tokens: float
    completion_tokens: float
    tokens: float
    window_s: float  # the span the rates were measured over
    capped: bool  # more entries than the publisher reads per tick: rates are lower bounds


class FleetSnapshot(TypedDict):
    at_ms: int  # Valkey's clock when read
    policy_version: int | None
    models: list[ModelRow]
    classes: list[ClassRow]  # every model's queues by class: depth summed, oldest wait
    rates: Rates
    per_model: dict[str, Rates]


class SnapshotMessage(TypedDict):
    type: SnapshotType
    snapshot: FleetSnapshot


# What the page's consumer sends besides snapshots: the state of its own link to Valkey (the
# Channels layer). The publisher cannot say "Valkey is away" to the pages — its messages go
# through Valkey — so each consumer says it, from what its own layer calls answer.
LayerEvent = Literal["fleet.unavailable", "fleet.available"]
UNAVAILABLE_TYPE: Final[LayerEvent] = "fleet.unavailable"
AVAILABLE_TYPE: Final[LayerEvent] = "fleet.available"


class LayerMessage(TypedDict):
    """Handed to the consumer's dispatch by its own layer receive, never sent by others."""

    type: LayerEvent


class StatusMessage(TypedDict):
    """To the browser: ``unavailable`` while the portal cannot reach Valkey (the numbers on
    the page stop being live), ``available`` once it can again (snapshots follow)."""

    status: Literal["unavailable", "available"]
    detail: str
