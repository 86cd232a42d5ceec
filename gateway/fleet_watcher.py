"""The fleet watcher: every vLLM replica's load, scraped into Valkey for the scheduler.

``python -m gateway.fleet_watcher`` keeps the policy snapshot current (the models and their
replicas), and every ``SWITCHYARD_FLEET_SCRAPE_INTERVAL_SECONDS`` scrapes every replica's
``/metrics`` at once over one pooled session. Each cycle rewrites ``sy:{sy/<model>}:fleet:<model>``
(replica base URL → ``"<waiting>|<running>|<kv_usage>|<scraped_at_ms>|<in_flight>|<max_running>"``)
in one MULTI/EXEC, so readers never see a half-written model and replicas dropped from the
policy disappear.

Two fields let the scheduler judge vLLM's queue between scrapes. ``in_flight``: the pool's
requests in flight on the replica (``sy:{sy/<model>}:inflight:<model>``), read just before the
scrape, so that the scripts count the grants and releases made since. ``max_running``: the
replica's batch size as learned here, the most requests seen running while it kept a queue
(the backpressure threshold reached on two scrapes in a row: vLLM's ``max_num_seqs``, or
what its KV cache holds), and any larger count seen after; 0 until then. It is kept across
cycles and restarts (read back from the hash), and caps what the scheduler sends it to that
plus the threshold.

Times are Valkey's clock (gateway/scheduling/clock.py, re-measured every cycle), not this
host's: the gateways judge an entry's age in that clock too, so a watcher host whose clock
is off still writes entries they find fresh.

Failure is never mistaken for idleness: a replica that refuses, hangs past the scrape timeout,
answers non-200 or serves no vLLM gauges is written as saturated (``UNREACHABLE_WAITING``
requests waiting, stamped with the time of the attempt); a watcher that stops writing leaves
timestamps that age, and the scheduler counts a stale entry as saturated too.

The same scrape reads vLLM's token counters (prompt and generation); every
``SWITCHYARD_FLEET_THROUGHPUT_INTERVAL_SECONDS`` the watcher writes each model's measured
tokens per second and its capacity into ``sy:{sy}:throughput:<model>`` (``ThroughputMeter``;
in the same MULTI/EXEC), which the feasibility model of file work reads (docs/files.md).

After each write, for every model with a replica below the waiting threshold, the watcher
calls ``on_drained(model)`` (by default ``Scheduler.pump``), so that requests queued while the
fleet was saturated or its entries stale are placed as soon as there is room.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import orjson
import valkey.asyncio as avalkey
from prometheus_client.parser import text_string_to_metric_families
from valkey.asyncio.cluster import ValkeyCluster

from gateway.autopipeline import auto_pipeline
from gateway.errors import GatewayError
from gateway.fleet_settings import FleetSettings
from gateway.policy import Policy
from gateway.policy_store import PolicyStore
from gateway.scheduling import Scheduler, fleet_entry
from gateway.scheduling import keys as scheduling_keys
from gateway.scheduling.clock import ValkeyClock
from runtime.env import env_float
from runtime.service import run_service
from runtime.valkey_urls import VALKEY_FAILURES, async_client, async_transaction

logger = logging.getLogger("gateway.fleet_watcher")

# Every pool's fleet hash, whatever its model: "sy:{sy/*}:fleet:*" (a SCAN pattern; braces
# are plain characters to it).
FLEET_KEY_PATTERN = scheduling_keys.pool_prefix("*") + "fleet:*"
HEARTBEAT_KEY = "sy:{sy}:fleet:watcher:heartbeat"
# Far above any real queue, so every "waiting < threshold" test fails for a replica we cannot
# see, whatever threshold a gateway is configured with.
UNREACHABLE_WAITING = 1_000_000_000

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
_TOKEN_COUNTERS = frozenset((PROMPT_TOKENS, GENERATION_TOKENS))
_GAUGES = frozenset((WAITING, RUNNING, KV_USAGE)) | _TOKEN_COUNTERS
_GAUGE_PREFIXES = tuple(_GAUGES)

DrainedCallback = Callable[[str], Awaitable[None]]


def fleet_key(model: str) -> str:
    return scheduling_keys.fleet(model)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def now_ms() -> int:
    """This host's wall clock, for tests and tools; entries are stamped with Valkey's."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One replica's load as the watcher last saw it; the value of one fleet hash field."""

    waiting: int
    running: int
    kv_usage: float
    scraped_at_ms: int
    # The pool's requests in flight on the replica when the scrape began (None: not known).
    in_flight_at_scrape: int | None = None
    # The replica's batch size as learned by the watcher (0: not yet).
    max_running: int = 0
    # Prompt plus generation tokens processed since it started (vLLM's counters; None: not
    # served). Not part of the fleet entry: it feeds the throughput measurement.
    tokens: float | None = None

    @classmethod
    def unreachable(cls, at_ms: int) -> ReplicaLoad:
        return cls(UNREACHABLE_WAITING, 0, 1.0, at_ms)

    @classmethod
    def decode(cls, raw: bytes | str) -> ReplicaLoad:
        """Parse a fleet hash value (four fields, or six; further ones are ignored as the
        scripts do); raises ValueError on anything malformed."""
        text = raw.decode() if isinstance(raw, bytes) else raw
        fields = text.split("|")
        if len(fields) < 4:
            raise ValueError(f"a fleet entry has at least four fields, not {text!r}")
        waiting, running, kv_usage, scraped_at = fields[:4]
        in_flight = fields[4] if len(fields) > 4 else ""
        max_running = fields[5] if len(fields) > 5 else ""
        return cls(
            int(waiting),
            int(running),
            float(kv_usage),
            int(scraped_at),
            int(in_flight) if in_flight else None,
            int(max_running) if max_running else 0,
        )

    def encode(self) -> str:
        return fleet_entry(
            waiting=self.waiting,
            running=self.running,
            kv_usage=self.kv_usage,
            scraped_at_ms=self.scraped_at_ms,
            in_flight=self.in_flight_at_scrape,
            max_running=self.max_running,
        )

    @property
    def reachable(self) -> bool:
        return self.waiting < UNREACHABLE_WAITING

    def age_ms(self, now: int) -> int:
        return now - self.scraped_at_ms

    def waiting_now(self, in_flight: int | None) -> int:
        """vLLM's queue as the scheduler estimates it with ``in_flight`` requests of the pool
        on the replica now: a scrape that saw requests waiting saw every batch slot taken,
        so each grant since waits too and each release frees a slot (common.lua)."""
        if in_flight is None or self.in_flight_at_scrape is None or self.waiting == 0:
            return self.waiting
        return self.waiting + in_flight - self.in_flight_at_scrape

    def cap(self, policy_cap: int, waiting_threshold: int) -> int:
        """The most requests in flight the scheduler sends it: the policy's cap, and at most
        the learned batch size plus the threshold."""
        if self.max_running > 0:
            return min(policy_cap, self.max_running + waiting_threshold)
        return policy_cap

    def has_room(
        self,
        *,
        now: int,
        stale_ms: int,
        waiting_threshold: int,
        in_flight: int | None = None,
        policy_cap: int | None = None,
    ) -> bool:
        """The scheduler's test (common.lua ``has_room``): fresh, vLLM's own queue below the
        threshold (counting grants and releases since the scrape when ``in_flight``, the
        pool's requests on it now, is given) and, with ``policy_cap``, room under the cap."""
        if self.age_ms(now) > stale_ms or self.waiting_now(in_flight) >= waiting_threshold:
            return False
        if policy_cap is None:
            return True
        return (in_flight or 0) < self.cap(policy_cap, waiting_threshold)


class ScrapeError(Exception):
    """The replica answered, but not with vLLM's gauges."""


def _gauge_lines(text: str) -> str:
    """Only the three gauges' lines: a real vLLM exposes hundreds of histogram series, and
    the parser's cost grows with every line it is given."""
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) > 2 and parts[2] in _GAUGES:
                kept.append(line)
        elif line.startswith(_GAUGE_PREFIXES):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in _GAUGES:
                kept.append(line)
    kept.append("")
    return "\n".join(kept)


def parse_vllm_metrics(text: str, *, at_ms: int) -> ReplicaLoad:
    """Read the load from a vLLM ``/metrics`` exposition (Prometheus text format).

    Series of several engines (data parallelism) are summed; the KV-cache usage is the
    fullest engine's. Raises ScrapeError when the waiting or running gauge is missing.
    """
    waiting = running = 0.0
    kv_usage = 0.0
    tokens = 0.0
    seen: set[str] = set()
    for family in text_string_to_metric_families(_gauge_lines(text)):
        for sample in family.samples:
            if sample.name in _TOKEN_COUNTERS:
                tokens += sample.value
            elif sample.name == WAITING:
                waiting += sample.value
            elif sample.name == RUNNING:
                running += sample.value
            elif sample.name == KV_USAGE:
                kv_usage = max(kv_usage, sample.value)
            else:
                continue
            seen.add(sample.name)
    if WAITING not in seen or RUNNING not in seen:
        raise ScrapeError("no vLLM request gauges in /metrics")
    counted = bool(seen & _TOKEN_COUNTERS)
    return ReplicaLoad(
        round(waiting), round(running), kv_usage, at_ms, tokens=tokens if counted else None
    )


@dataclass(frozen=True, slots=True)
class WatcherSettings:
    # What the gateways and batchers judge by (gateway/fleet_settings.py): the same policy
    # refresh, backpressure threshold and staleness bound, for the pumps this watcher triggers.
    fleet: FleetSettings
    scrape_interval_s: float = 0.25
    scrape_timeout_s: float = 0.5
    # Throughput (docs/files.md): a rate is taken over at least this long, smoothed with
    # this EWMA weight; the capacity (highest rate seen) halves over this long unless seen.
    throughput_interval_s: float = 5.0
    throughput_alpha: float = 0.3
    capacity_half_life_s: float = 86400.0

    @classmethod
    def from_env(cls) -> WatcherSettings:
        return cls(
            fleet=FleetSettings.from_env(),
            scrape_interval_s=env_float(
                "SWITCHYARD_FLEET_SCRAPE_INTERVAL_SECONDS", 0.25, minimum=0.01
            ),
            scrape_timeout_s=env_float(
                "SWITCHYARD_FLEET_SCRAPE_TIMEOUT_SECONDS", 0.5, minimum=0.01
            ),
            throughput_interval_s=env_float(
                "SWITCHYARD_FLEET_THROUGHPUT_INTERVAL_SECONDS", 5.0, minimum=0.05
            ),
            throughput_alpha=env_float("SWITCHYARD_FLEET_THROUGHPUT_ALPHA", 0.3, minimum=0.01),
            capacity_half_life_s=env_float(
                "SWITCHYARD_FLEET_CAPACITY_HALF_LIFE_SECONDS", 86400.0, minimum=1.0
            ),
        )

    @property
    def heartbeat_ttl_ms(self) -> int:
        # Long enough to survive a few slow cycles, short enough that a dead watcher shows.
        return max(5_000, int(20 * (self.scrape_interval_s + self.scrape_timeout_s) * 1000))


@dataclass(slots=True)
class _Meter:
    """One model's throughput: the counters at the last sample, and what was measured."""

    at_ms: int = 0
    counters: dict[str, float] = field(default_factory=dict)
    rate: float = 0.0  # tokens/s, EWMA-smoothed
    capacity: float = 0.0  # the highest sustained rate, decayed
    measured: bool = False


class ThroughputMeter:
    """Tokens per second per model from vLLM's token counters: the sum over the model's
    replicas of the counters' increase over at least ``interval_s``, divided by the time.

    A replica whose counter went down (restarted) or that was not read at both samples adds
    nothing to that interval. The rate is EWMA-smoothed; the capacity is the highest
    interval rate seen, halved every ``half_life_s`` it is not reached again, so a fleet that
    shrank is believed within a day or so, and a quiet night does not erase it."""

    def __init__(self, interval_s: float, alpha: float, half_life_s: float) -> None:
        self.interval_ms = interval_s * 1000
        self.alpha = alpha
        self.half_life_s = half_life_s
        self._meters: dict[str, _Meter] = {}

    def restore(self, model: str, rate: float, capacity: float) -> None:
        meter = self._meters.setdefault(model, _Meter())
        meter.rate, meter.capacity, meter.measured = rate, capacity, capacity > 0

    def observe(
        self, model: str, replicas: dict[str, ReplicaLoad], at_ms: int
    ) -> dict[str, str] | None:
        """The hash to write for ``model`` when an interval completed, else None."""
        counters = {
            url: load.tokens
            for url, load in replicas.items()
            if load.reachable and load.tokens is not None
        }
        meter = self._meters.setdefault(model, _Meter())
        if not meter.counters:
            meter.at_ms, meter.counters = at_ms, counters
            return None
        elapsed_ms = at_ms - meter.at_ms
        if elapsed_ms < self.interval_ms:
            return None
        delta = sum(
            now - meter.counters[url]
            for url, now in counters.items()
            if url in meter.counters and now >= meter.counters[url]
        )
        sample = delta / (elapsed_ms / 1000)
        meter.rate = (
            self.alpha * sample + (1 - self.alpha) * meter.rate if meter.measured else sample
        )
        decay = 0.5 ** ((elapsed_ms / 1000) / self.half_life_s)
        meter.capacity = max(sample, meter.capacity * decay)
        meter.measured = True
        meter.at_ms, meter.counters = at_ms, counters
        return {
            "rate": f"{meter.rate:.3f}",
            "capacity": f"{meter.capacity:.3f}",
            "last": f"{sample:.3f}",
            "replicas": str(len(counters)),
            "at_ms": str(at_ms),
        }


@dataclass(frozen=True, slots=True)
class CycleReport:
    """What one scrape cycle wrote: model → replica → load, and which models drained."""

    at_ms: int
    duration_ms: float
    loads: dict[str, dict[str, ReplicaLoad]] = field(default_factory=dict)
    drained: frozenset[str] = frozenset()
    written: bool = True

    @property
    def unreachable(self) -> list[str]:
        return sorted(
            replica
            for replicas in self.loads.values()
            for replica, load in replicas.items()
            if not load.reachable
        )


class FleetWatcher:
    """Scrapes the fleet into Valkey; ``run()`` loops, ``run_cycle()`` does one pass."""

    def __init__(
        self,
        client: avalkey.Valkey,
        settings: WatcherSettings,
        *,
        on_drained: DrainedCallback | None = None,
        clock: ValkeyClock | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        # Entries are stamped in Valkey's clock, the one every gateway compares them with.
        self.clock = clock if clock is not None else ValkeyClock()
        self.policy = PolicyStore(
            client,
            refresh_s=settings.fleet.policy_refresh_s,
            max_staleness_s=settings.fleet.policy_max_staleness_s,
        )
        self._on_drained = on_drained
        self._session: aiohttp.ClientSession | None = None
        self._reachable: dict[str, bool] = {}
        # Replica → batch size learned (ReplicaLoad.max_running); read back from the fleet
        # hash on the first cycle, so that a restarted watcher does not forget it.
        self._max_running: dict[str, int] = {}
        self._queued_before: set[str] = set()  # replicas at the threshold at the last scrape
        self._restored = False
        self._written_models: set[str] | None = None  # None: not yet reconciled with Valkey
        self.throughput = ThroughputMeter(
            settings.throughput_interval_s,
            settings.throughput_alpha,
            settings.capacity_half_life_s,
        )
        self._identity = f"{socket.gethostname()}:{os.getpid()}"
        self.last_cycle_at_ms: int | None = None
        self.last_write_ok: bool | None = None  # None: nothing tried yet

    async def start(self) -> None:
        timeout = self.settings.scrape_timeout_s
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=30, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=timeout),
            # Prometheus text, never OpenMetrics: that is the format the parser reads.
            headers={"Accept": "text/plain;version=0.0.4"},
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- one cycle ------------------------------------------------------------------------
    async def scrape(self, replica: str) -> ReplicaLoad:
        """One replica's load; a saturated load when it cannot be read in time."""
        assert self._session is not None, "start() first"
        try:
            async with asyncio.timeout(self.settings.scrape_timeout_s):
                async with self._session.get(replica.rstrip("/") + "/metrics") as response:
                    if response.status != 200:
                        raise ScrapeError(f"/metrics answered {response.status}")
                    text = (await response.read()).decode(errors="replace")
            return parse_vllm_metrics(text, at_ms=self.clock())
        except (aiohttp.ClientError, TimeoutError, ScrapeError, ValueError) as exc:
            logger.debug("scrape_failed replica=%s error=%r", replica, exc)
            return ReplicaLoad.unreachable(self.clock())

    async def run_cycle(self) -> CycleReport:
        started = time.perf_counter()
        policy = self._policy()
        if policy is None:
            return CycleReport(self.clock(), 0.0, written=False)
        try:
            await self.clock.sync(self.client.time)
        except VALKEY_FAILURES as exc:
            logger.debug("clock_sync_failed error=%r", exc)  # the write will fail too
        models = {name: model.replicas for name, model in policy.models.items()}
        replicas = sorted({url for urls in models.values() for url in urls})
        # Before the scrape: a grant made while it runs counts twice (in vLLM's gauges and
        # as made since), never zero times.
        in_flight = await self._in_flight(list(models))
        scraped = dict(
            zip(replicas, await asyncio.gather(*map(self.scrape, replicas)), strict=True)
        )
        self._learn(scraped)
        loads = {
            name: {url: self._entry(scraped[url], name, url, in_flight) for url in urls}
            for name, urls in models.items()
        }
        at = self.clock()
        measured = {
            name: sample
            for name, replicas in loads.items()
            if (sample := self.throughput.observe(name, replicas, at)) is not None
        }
        written = await self._write(loads, at, policy.version, started, measured)
        drained = self._drained(loads) if written else frozenset()
        self._log_transitions(loads)
        if written:
            self.last_cycle_at_ms = at
        report = CycleReport(at, (time.perf_counter() - started) * 1000, loads, drained, written)
        if drained:
            await self._notify(drained)
        return report

    async def _in_flight(self, models: Sequence[str]) -> dict[str, dict[str, int]] | None:
        """Each model's requests in flight per replica (None when Valkey cannot say); on the
        first cycle also the batch sizes a previous watcher learned."""
        restore = not self._restored
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for model in models:
                    pipe.hgetall(scheduling_keys.in_flight(model))
                if restore:
                    for model in models:
                        pipe.hgetall(fleet_key(model))
                    for model in models:
                        pipe.hgetall(scheduling_keys.throughput(model))
                replies = await pipe.execute()
        except VALKEY_FAILURES as exc:
            logger.debug("in_flight_read_failed error=%r", exc)
            return None
        counts = {
            model: {_text(url): int(n) for url, n in reply.items()}
            for model, reply in zip(models, replies, strict=False)
        }
        if restore:
            n = len(models)
            for model, reply in zip(models, replies[2 * n :], strict=False):
                with contextlib.suppress(KeyError, ValueError):
                    fields = {_text(k): _text(v) for k, v in reply.items()}
                    self.throughput.restore(model, float(fields["rate"]), float(fields["capacity"]))
            for reply in replies[n : 2 * n]:
                for url, raw in reply.items():
                    with contextlib.suppress(ValueError):
                        self._raise_max_running(_text(url), ReplicaLoad.decode(raw).max_running)
            self._restored = True
        return counts

    def _learn(self, scraped: dict[str, ReplicaLoad]) -> None:
        """A replica that keeps a queue runs its whole batch: the most running then is its
        batch size; once known, any larger count seen raises it (a cap at the learned size
        plus the threshold still lets the batch grow past it, by the threshold a cycle).

        "Keeps a queue" is the backpressure threshold reached on two scrapes in a row: a
        request that arrived between two engine steps waits until the next one, and a
        scrape that catches it says nothing about the batch — learning from it would cap a
        256-sequence replica at a handful."""
        threshold = self.settings.fleet.backpressure_waiting
        queued = {
            url for url, load in scraped.items() if load.reachable and load.waiting >= threshold
        }
        for url, load in scraped.items():
            if not load.reachable:
                continue
            if (url in queued and url in self._queued_before) or self._max_running.get(url, 0):
                self._raise_max_running(url, load.running)
        self._queued_before = queued

    def _raise_max_running(self, url: str, running: int) -> None:
        if running > self._max_running.get(url, 0):
            self._max_running[url] = running
            logger.info("replica_batch_learned replica=%s max_running=%s", url, running)

    def _entry(
        self,
        load: ReplicaLoad,
        model: str,
        url: str,
        in_flight: dict[str, dict[str, int]] | None,
    ) -> ReplicaLoad:
        if not load.reachable:
            return load
        return replace(
            load,
            in_flight_at_scrape=None if in_flight is None else in_flight[model].get(url, 0),
            max_running=self._max_running.get(url, 0),
        )

    def _policy(self) -> Policy | None:
        try:
            return self.policy.current()
        except GatewayError:
            return None  # not loaded yet, or too stale to trust: scrape nothing

    async def _write(
        self,
        loads: dict[str, dict[str, ReplicaLoad]],
        at: int,
        version: int,
        started: float,
        measured: dict[str, dict[str, str]] | None = None,
    ) -> bool:
        try:
            if self._written_models is None:
                self._written_models = await self._models_in_valkey()
            gone = self._written_models - loads.keys()
            heartbeat = {
                "at_ms": at,
                "cycle_ms": round((time.perf_counter() - started) * 1000, 1),
                "models": len(loads),
                "replicas": sum(len(r) for r in loads.values()),
                "unreachable": sum(not x.reachable for r in loads.values() for x in r.values()),
                "policy_version": version,
                "watcher": self._identity,
            }

            # MULTI/EXEC: readers see a whole model or the previous one, and DEL + HSET drops
            # replicas the policy no longer lists. One for everything on one Valkey; on a
            # Cluster one per pool's slot (each model's fleet hash is in its pool's slot,
            # gateway/slots.py) and one for the shared slot, at once.
            def fleet_ops(pipe: Any, models: Iterable[str]) -> None:
                for model in models:
                    pipe.delete(fleet_key(model))
                    replicas = loads.get(model)
                    if replicas:
                        pipe.hset(
                            fleet_key(model),
                            mapping={url: load.encode() for url, load in replicas.items()},
                        )

            def shared_ops(pipe: Any) -> None:
                for model, sample in (measured or {}).items():
                    pipe.hset(scheduling_keys.throughput(model), mapping=sample)
                pipe.set(HEARTBEAT_KEY, orjson.dumps(heartbeat), px=self.settings.heartbeat_ttl_ms)

            models = sorted(gone | loads.keys())
            if isinstance(self.client, ValkeyCluster):
                await asyncio.gather(
                    *(self._transaction(fleet_key(m), fleet_ops, [m]) for m in models),
                    self._transaction(HEARTBEAT_KEY, lambda pipe, _: shared_ops(pipe), []),
                )
            else:

                def every_op(pipe: Any, _: Iterable[str]) -> None:
                    fleet_ops(pipe, models)
                    shared_ops(pipe)

                await self._transaction(HEARTBEAT_KEY, every_op, models)
        except VALKEY_FAILURES as exc:
            if self.last_write_ok is not False:
                logger.warning("fleet_write_failed error=%s", exc.__class__.__name__)
            self.last_write_ok = False
            return False
        if self.last_write_ok is not True:
            logger.info("fleet_write_ok models=%s", len(loads))
        self.last_write_ok = True
        self._written_models = set(loads)
        return True

    async def _transaction(
        self, key: str, ops: Callable[[Any, Iterable[str]], None], models: Iterable[str]
    ) -> None:
        async with await async_transaction(self.client, key) as pipe:
            ops(pipe, models)
            await pipe.execute()

    async def _models_in_valkey(self) -> set[str]:
        """Models a previous watcher wrote, so that ones removed while we were down go too."""
        found: set[str] = set()
        async for key in self.client.scan_iter(match=FLEET_KEY_PATTERN, _type="HASH"):
            found.add(_text(key).split("}:fleet:", 1)[1])
        return found

    def _drained(self, loads: dict[str, dict[str, ReplicaLoad]]) -> frozenset[str]:
        """Models with a replica that has room, to pump on every cycle — not only on a change:
        requests may have queued while an entry was stale (a slow cycle, a watcher restart)
        and nothing else would pump them until a release. Pumping an empty queue is one
        cheap script call."""
        threshold = self.settings.fleet.backpressure_waiting
        return frozenset(
            model
            for model, replicas in loads.items()
            if any(load.waiting < threshold for load in replicas.values())
        )

    async def _notify(self, models: Iterable[str]) -> None:
        if self._on_drained is None:
            return
        callback = self._on_drained

        async def call(model: str) -> None:
            try:
                async with asyncio.timeout(max(self.settings.scrape_interval_s, 0.5)):
                    await callback(model)
            except Exception as exc:  # a failing hook must not stop the scraping
                logger.warning("on_drained_failed model=%s error=%r", model, exc)

        await asyncio.gather(*map(call, models))

    def _log_transitions(self, loads: dict[str, dict[str, ReplicaLoad]]) -> None:
        current = {url: x.reachable for replicas in loads.values() for url, x in replicas.items()}
        for url, reachable in current.items():
            if reachable and self._reachable.get(url) is False:
                logger.info("replica_reachable replica=%s", url)
            elif not reachable and self._reachable.get(url) is not False:
                logger.warning("replica_unreachable replica=%s written_as=saturated", url)
        self._reachable = current

    # --- the loop -------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Scrape every interval until ``stop`` is set; survives Valkey and replica outages."""
        await self.start()
        interval = self.settings.scrape_interval_s
        refresh_at = summary_at = time.monotonic()
        cycles = 0
        try:
            while not stop.is_set():
                tick = time.monotonic()
                # The policy is refreshed in this loop, not in a task of its own: one task
                # means nothing to cancel on shutdown, and a cycle never sees a policy change
                # half-way.
                if tick >= refresh_at:
                    await self._refresh_policy()
                    refresh_at = tick + self.settings.fleet.policy_refresh_s
                try:
                    report = await self.run_cycle()
                    cycles += 1
                    if report.written and time.monotonic() - summary_at >= 30:
                        logger.info(
                            "fleet_cycle models=%s replicas=%s unreachable=%s cycle_ms=%.1f "
                            "cycles=%s",
                            len(report.loads),
                            sum(len(r) for r in report.loads.values()),
                            len(report.unreachable),
                            report.duration_ms,
                            cycles,
                        )
                        summary_at = time.monotonic()
                except Exception:
                    logger.exception("fleet_cycle_failed")
                # Fixed cadence: the next cycle starts one interval after this one started.
                delay = max(0.0, tick + interval - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
        finally:
            await self.close()

    async def _refresh_policy(self) -> None:
        try:
            await self.policy.refresh()
        except VALKEY_FAILURES as exc:
            # (VALKEY_FAILURES has ValkeyClusterException: a Cluster client reaching none of
            # its nodes while it re-reads the slot map; it once ended the process)
            logger.warning("policy_refresh_failed error=%s", exc.__class__.__name__)
        except (ValueError, KeyError, TypeError) as exc:
            logger.error("policy_snapshot_invalid error=%r", exc)


async def serve(settings: WatcherSettings, *, on_drained: DrainedCallback | None = None) -> None:
    """Run a watcher until SIGTERM or SIGINT."""
    client = async_client(settings.fleet.valkey_url, socket_timeout=2.0, socket_connect_timeout=1.0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def stopping(signum: signal.Signals) -> None:
        logger.info("fleet_watcher_stopping signal=%s", signum.name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping, signum)
    clock = ValkeyClock()  # synced by the watcher's cycles, shared with its pump
    scheduler: Scheduler | None = None
    if on_drained is None:
        # Queued requests wait for capacity; a replica that drains is capacity, so pump
        # the model's queue onto it at once instead of at the next release.
        scheduler = Scheduler(
            client,
            pipe=auto_pipeline(client),  # one server, Sentinel or Cluster
            stale_ms=settings.fleet.stale_ms,
            waiting_threshold=settings.fleet.backpressure_waiting,
            clock=clock,
        )

        async def pump(model: str) -> None:
            assert scheduler is not None
            await scheduler.pump(model)

        on_drained = pump
    watcher = FleetWatcher(client, settings, on_drained=on_drained, clock=clock)
    logger.info(
        "fleet_watcher_started interval_s=%s timeout_s=%s waiting_threshold=%s",
        settings.scrape_interval_s,
        settings.scrape_timeout_s,
        settings.fleet.backpressure_waiting,
    )
    try:
        await watcher.run(stop)
    finally:
        if scheduler is not None:
            await scheduler.close()
        await client.aclose()
        logger.info("fleet_watcher_stopped")


def main(argv: list[str] | None = None) -> int:
    return run_service("fleet_watcher", WatcherSettings.from_env, serve)


if __name__ == "__main__":
    sys.exit(main())
