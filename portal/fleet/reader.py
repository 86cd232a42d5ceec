"""Reads one picture of the fleet from Valkey: what the fleet watcher, the gateways'
scheduling scripts and their accounting streams already write (docs/gateway-scheduling.md,
"Valkey key layout"). Nothing here writes to a key the hot path reads.

A tick costs three round trips whatever the fleet's size: the policy version (and the
snapshot when it moved), one pipeline over every model's hashes and queues, one pipeline for
the waiters' ``qi:`` hashes and the two accounting streams.

Rates come from the accounting streams, by entry id: ``XRANGE`` over the milliseconds since
the previous tick. Stream ids are the Valkey server's clock, and so is ``TIME`` read at the
start of the tick, so every entry up to ``now - 1`` ms is already written when they are read:
consecutive windows neither overlap nor miss an entry, and the publisher never lags behind
(at most ``stream_cap`` entries a tick are read; past it the rates are marked lower bounds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import valkey.asyncio as avalkey

from gateway.accounting import DECISIONS_STREAM, USAGE_STREAM
from gateway.discovery import is_service_name
from gateway.fleet_watcher import ReplicaLoad
from gateway.policy import SNAPSHOT_KEY, VERSION_KEY, Policy, parse_snapshot
from gateway.scheduling import keys
from portal.fleet.messages import ClassRow, FleetSnapshot, ModelRow, Rates, ReplicaRow

# The gateway's defaults (gateway/settings.py), for a pool no acquire has described yet.
DEFAULT_STALE_MS = 900
DEFAULT_WAITING_THRESHOLD = 3
# A queue this long is no queue but a marker: the watcher writes 10^9 for a replica it cannot
# reach (``ReplicaLoad.unreachable``), a gateway 10^6 for one it failed to connect to
# (``saturated_entry``).
UNREACHABLE_FROM = 1_000_000


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _int(value: Any, default: int = 0) -> int:
    if value is None or value == b"" or value == "":
        return default
    try:
        return int(float(_text(value)))
    except ValueError:
        return default


def _texts(mapping: Mapping[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in mapping.items()}


@dataclass
class _Counter:
    admitted: int = 0
    queued: int = 0
    shed: int = 0
    refused: int = 0
    fallbacks: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def rates(self, window_s: float, *, capped: bool) -> Rates:
        per = 1.0 / window_s if window_s > 0 else 0.0
        return {
            "admitted": round(self.admitted * per, 2),
            "queued": round(self.queued * per, 2),
            "shed": round(self.shed * per, 2),
            "refused": round(self.refused * per, 2),
            "fallbacks": round(self.fallbacks * per, 2),
            "prompt_tokens": round(self.prompt_tokens * per, 1),
            "completion_tokens": round(self.completion_tokens * per, 1),
            "tokens": round((self.prompt_tokens + self.completion_tokens) * per, 1),
            "window_s": round(window_s, 3),
            "capped": capped,
        }


@dataclass
class FleetReader:
    """One per publisher: remembers the policy it parsed and where the last tick ended."""

    client: avalkey.Valkey
    prefix: str = keys.KEY_PREFIX
    stream_cap: int = 20_000  # entries read per stream per tick
    queue_cap: int = 2_000  # waiters per model whose class and age are read per tick
    policy: Policy | None = None
    since_ms: int | None = None  # the first millisecond the next tick's rates cover

    async def now_ms(self) -> int:
        seconds, micros = await self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def _policy(self) -> Policy | None:
        version = await self.client.get(VERSION_KEY)
        if version is None:
            return self.policy
        if self.policy is None or _int(version) != self.policy.version:
            raw = await self.client.get(SNAPSHOT_KEY)
            if raw is not None:
                self.policy = parse_snapshot(raw)
        return self.policy

    async def read(self) -> FleetSnapshot:
        now = await self.now_ms()
        policy = await self._policy()
        since = self.since_ms if self.since_ms is not None else now - 1000
        self.since_ms = now
        models = _model_names(policy)
        classes = sorted(
            (policy.priority_classes.values() if policy else ()), key=lambda c: (c.rank, c.name)
        )

        first = self.client.pipeline(transaction=False)
        for model in models:
            first.hgetall(keys.fleet(model, prefix=self.prefix))
            first.hgetall(keys.in_flight(model, prefix=self.prefix))
            first.zcard(keys.leases(model, prefix=self.prefix))
            first.hmget(keys.pool(model, prefix=self.prefix), ["_stale_ms", "_threshold"])
            first.hgetall(f"{keys.pool_prefix(model, prefix=self.prefix)}cif:{model}")
            first.zcard(keys.queue(model, prefix=self.prefix))
            first.zrange(keys.queue(model, prefix=self.prefix), 0, self.queue_cap - 1)
            for cls in classes:
                first.get(keys.queue_length(model, cls.name, prefix=self.prefix))
        replies: list[Any] = await first.execute()

        per_model: list[tuple[str, list[Any], list[str]]] = []
        step = 7 + len(classes)
        second = self.client.pipeline(transaction=False)
        for index, model in enumerate(models):
            chunk = replies[index * step : (index + 1) * step]
            waiters = [_text(member) for member in chunk[6]]
            per_model.append((model, chunk, waiters))
            for waiter in waiters:
                second.hmget(
                    keys.waiter(waiter, model, prefix=self.prefix), ["class", "enqueued_at"]
                )
        streams = now - 1 >= since  # else a clock that did not move: nothing new to count
        if streams:
            end = str(now - 1)
            second.xrange(USAGE_STREAM, min=str(since), max=end, count=self.stream_cap)
            second.xrange(DECISIONS_STREAM, min=str(since), max=end, count=self.stream_cap)
        tail: list[Any] = await second.execute()
        usage, decisions = (tail[-2], tail[-1]) if streams else ([], [])

        rows: list[ModelRow] = []
        offset = 0
        for model, chunk, waiters in per_model:
            waiter_fields = tail[offset : offset + len(waiters)]
            offset += len(waiters)
            rows.append(self._model_row(model, chunk, waiter_fields, policy, classes, now))

        window_s = (now - since) / 1000
        capped = len(usage) >= self.stream_cap or len(decisions) >= self.stream_cap
        total, by_model = _count(usage, decisions)
        return {
            "at_ms": now,
            "policy_version": policy.version if policy else None,
            "models": rows,
            "classes": _across_models(rows),
            "rates": total.rates(window_s, capped=capped),
            "per_model": {
                name: counter.rates(window_s, capped=capped)
                for name, counter in sorted(by_model.items())
            },
        }

    def _model_row(
        self,
        model: str,
        chunk: list[Any],
        waiter_fields: Sequence[Any],
        policy: Policy | None,
        classes: Sequence[Any],
        now: int,
    ) -> ModelRow:
        fleet, inflight = _texts(chunk[0]), _texts(chunk[1])
        stale_ms = _int(chunk[3][0], DEFAULT_STALE_MS)
        threshold = _int(chunk[3][1], DEFAULT_WAITING_THRESHOLD)
        class_in_flight = _texts(chunk[4])
        entry = policy.models.get(model) if policy else None
        # A service name (dns+http://) stands for the pods the watcher found and wrote.
        listed = [r for r in entry.replicas if not is_service_name(r)] if entry else []
        replicas = listed + sorted(set(fleet) - set(listed))
        policy_cap = entry.max_in_flight_per_replica if entry else None
        replica_rows = [
            _replica_row(
                url, fleet.get(url), _int(inflight.get(url)), now, stale_ms, threshold, policy_cap
            )
            for url in replicas
        ]
        oldest: dict[str, int] = {}
        for fields in waiter_fields:
            if not fields or fields[0] is None:
                continue  # granted or cancelled between the two pipelines
            name, enqueued = _text(fields[0]), _int(fields[1], now)
            oldest[name] = min(oldest.get(name, enqueued), enqueued)
        class_rows: list[ClassRow] = []
        for position, cls in enumerate(classes):
            cif = class_in_flight.get(cls.name)
            class_rows.append(
                {
                    "priority_class": cls.name,
                    "rank": cls.rank,
                    "depth": _int(chunk[7 + position]),
                    "oldest_wait_ms": max(now - oldest[cls.name], 0)
                    if cls.name in oldest
                    else None,
                    "in_flight": _int(cif) if cif is not None else None,
                }
            )
        return {
            "model": model,
            "replicas": replica_rows,
            "classes": class_rows,
            "leases": _int(chunk[2]),
            "queued": _int(chunk[5]),
        }


def _across_models(rows: Sequence[ModelRow]) -> list[ClassRow]:
    """Each class over every model's pool: waiters summed, the longest wait, in flight summed
    (None when no pool counts it)."""
    total: dict[str, ClassRow] = {}
    for model in rows:
        for row in model["classes"]:
            seen = total.setdefault(
                row["priority_class"],
                {**row, "depth": 0, "in_flight": None, "oldest_wait_ms": None},
            )
            seen["depth"] += row["depth"]
            if row["oldest_wait_ms"] is not None:
                seen["oldest_wait_ms"] = max(seen["oldest_wait_ms"] or 0, row["oldest_wait_ms"])
            if row["in_flight"] is not None:
                seen["in_flight"] = (seen["in_flight"] or 0) + row["in_flight"]
    return list(total.values())


def _model_names(policy: Policy | None) -> list[str]:
    # A model with versions has no pool of its own: its versions (``model@v2``) are pools.
    return sorted(n for n, m in policy.models.items() if m.routing is None) if policy else []


def _replica_row(
    url: str,
    raw: str | None,
    in_flight: int,
    now: int,
    stale_ms: int,
    threshold: int,
    policy_cap: int | None,
) -> ReplicaRow:
    if raw is None:
        return {
            "replica": url,
            "running": None,
            "waiting": None,
            "kv_usage": None,
            "in_flight": in_flight,
            "cap": policy_cap,
            "age_ms": None,
            "reachable": False,
            "saturated": True,  # no metrics: the scheduler counts it saturated, never idle
            "full": policy_cap is not None and in_flight >= policy_cap,
        }
    try:
        load = ReplicaLoad.decode(raw)
    except ValueError:
        load = ReplicaLoad.unreachable(0)
    reachable = load.waiting < UNREACHABLE_FROM
    cap = load.cap(policy_cap, threshold) if policy_cap is not None else None
    return {
        "replica": url,
        "running": load.running if reachable else None,
        "waiting": load.waiting_now(in_flight) if reachable else None,
        "kv_usage": load.kv_usage if reachable else None,
        "in_flight": in_flight,
        "cap": cap,
        "age_ms": max(load.age_ms(now), 0),
        "reachable": reachable,
        "saturated": not load.has_room(
            now=now, stale_ms=stale_ms, waiting_threshold=threshold, in_flight=in_flight
        ),
        "full": cap is not None and in_flight >= cap,
    }


def _count(usage: Sequence[Any], decisions: Sequence[Any]) -> tuple[_Counter, dict[str, _Counter]]:
    total = _Counter()
    by_model: dict[str, _Counter] = {}
    for _id, raw in usage:
        entry = _texts(raw)
        counters = (total, by_model.setdefault(entry.get("model", ""), _Counter()))
        forwarded = bool(entry.get("replica"))
        for counter in counters:
            # Admitted means forwarded to a replica; counted when it finishes, the one moment
            # a request always writes an entry (immediate admissions have no decision entry).
            counter.admitted += 1 if forwarded else 0
            counter.prompt_tokens += _int(entry.get("prompt_tokens"))
            counter.completion_tokens += _int(entry.get("completion_tokens"))
    for _id, raw in decisions:
        entry = _texts(raw)
        decision = entry.get("decision", "")
        counters = (total, by_model.setdefault(entry.get("model", ""), _Counter()))
        for counter in counters:
            if decision == "queued":
                counter.queued += 1
            elif decision == "shed":
                counter.shed += 1
            elif decision == "rejected":
                counter.refused += 1
            elif decision == "fallback":
                counter.fallbacks += 1
    return total, by_model
