"""An open-loop load generator over aiohttp, and the samplers that watch the fleet meanwhile.

Open loop: every request has a due time drawn in advance (Poisson arrivals per tenant, from a
fixed seed) and is sent at that time whatever the answers do; its latency is measured from the
due time, so a generator that falls behind, or a connection that is slow to open, counts
against the server as a real client would feel it (no coordinated omission). A request that
is not answered within the client timeout, or still open when the drain ends, is counted as
such and never dropped from the tally.

The samplers read each replica's vLLM ``/metrics`` (what a GPU dashboard would show) and,
behind a gateway, its queue in Valkey, on a fixed interval while the load runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp
import orjson
import valkey.asyncio as avalkey

from gateway.scheduling import keys


@dataclass(frozen=True)
class Stream:
    """One tenant's traffic: Poisson arrivals at ``rate`` requests/s, round-robin over
    ``urls`` (one URL: the gateway; several: the replicas, directly)."""

    tenant: str
    rate: float
    make_body: Callable[[int], bytes]
    urls: tuple[str, ...]
    key: str | None = None


@dataclass(frozen=True)
class Sample:
    tenant: str
    due_s: float  # since the phase started
    send_lag_s: float  # how late the generator actually sent it
    latency_s: float | None  # from the due time to the whole answer; None: no answer
    status: int  # HTTP status; 0 when there was none
    code: str  # error.code of a refusal, or "timeout" / "unfinished" / the client error
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retry_after: str | None = None  # a refusal's Retry-After header

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class LoadRun:
    samples: list[Sample]
    duration_s: float  # the scheduled window
    wall_s: float  # the window plus the drain

    def by_tenant(self, tenant: str) -> list[Sample]:
        return [s for s in self.samples if s.tenant == tenant]


def schedule(streams: Sequence[Stream], duration_s: float, seed: int) -> list[tuple[float, int]]:
    """(due time, stream index) for every request of the window, in order."""
    due: list[tuple[float, int]] = []
    for index, stream in enumerate(streams):
        if stream.rate <= 0:
            continue
        rng = random.Random(seed * 1_000_003 + zlib.crc32(stream.tenant.encode()))
        t = rng.expovariate(stream.rate)
        while t < duration_s:
            due.append((t, index))
            t += rng.expovariate(stream.rate)
    due.sort()
    return due


async def open_loop(
    session: aiohttp.ClientSession,
    streams: Sequence[Stream],
    *,
    duration_s: float,
    timeout_s: float,
    drain_s: float,
    seed: int = 1,
) -> LoadRun:
    """Send every stream's requests on schedule for ``duration_s``; wait at most ``drain_s``
    for the last answers, then cut what is still open (counted as "unfinished")."""
    loop = asyncio.get_running_loop()
    plan = schedule(streams, duration_s, seed)
    counters = [0] * len(streams)
    client_timeout = aiohttp.ClientTimeout(total=timeout_s)
    tasks: dict[asyncio.Task[Sample], tuple[str, float]] = {}
    start = loop.time()

    async def one(stream: Stream, url: str, body: bytes, due_s: float) -> Sample:
        sent = loop.time()
        headers = {"content-type": "application/json"}
        if stream.key is not None:
            headers["authorization"] = f"Bearer {stream.key}"
        lag = sent - start - due_s
        try:
            async with session.post(
                url, data=body, headers=headers, timeout=client_timeout
            ) as response:
                raw = await response.read()
                status = response.status
                retry_after = response.headers.get("retry-after")
        except TimeoutError:
            return Sample(stream.tenant, due_s, lag, None, 0, "timeout")
        except aiohttp.ClientError as exc:
            return Sample(stream.tenant, due_s, lag, None, 0, exc.__class__.__name__)
        latency = loop.time() - start - due_s
        try:
            document = orjson.loads(raw)
        except orjson.JSONDecodeError:
            document = {}
        if status == 200:
            usage = document.get("usage") or {}
            return Sample(
                stream.tenant,
                due_s,
                lag,
                latency,
                status,
                "",
                int(usage.get("prompt_tokens", 0)),
                int(usage.get("completion_tokens", 0)),
            )
        error = document.get("error") if isinstance(document, dict) else None
        code = str(error.get("code") or error.get("type") or "") if isinstance(error, dict) else ""
        return Sample(
            stream.tenant,
            due_s,
            lag,
            latency,
            status,
            code or f"http_{status}",
            retry_after=retry_after,
        )

    for due_s, index in plan:
        delay = start + due_s - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        stream = streams[index]
        n = counters[index]
        counters[index] += 1
        url = stream.urls[n % len(stream.urls)]
        task = asyncio.ensure_future(one(stream, url, stream.make_body(n), due_s))
        tasks[task] = (stream.tenant, due_s)
    remaining = start + duration_s - loop.time()
    if remaining > 0:
        await asyncio.sleep(remaining)
    if tasks:
        await asyncio.wait(tasks, timeout=drain_s)
    samples: list[Sample] = []
    for task, (tenant, due_s) in tasks.items():
        if task.done():
            samples.append(task.result())
        else:
            task.cancel()
            samples.append(Sample(tenant, due_s, 0.0, None, 0, "unfinished"))
    pending = [t for t in tasks if not t.done()]
    if pending:
        await asyncio.wait(pending, timeout=5)
    return LoadRun(samples, duration_s, loop.time() - start)


async def closed_loop_rate(
    session: aiohttp.ClientSession,
    urls: Sequence[str],
    make_body: Callable[[int], bytes],
    *,
    connections: int,
    warmup_s: float,
    duration_s: float,
) -> float:
    """Answers per second with ``connections`` requests always outstanding (round-robin over
    ``urls``): the fleet's capacity when every replica always has a queue."""
    loop = asyncio.get_running_loop()
    counter = 0
    answered: list[float] = []
    stop_at = loop.time() + warmup_s + duration_s

    async def worker(slot: int) -> None:
        nonlocal counter
        while loop.time() < stop_at:
            counter += 1
            url = urls[slot % len(urls)]
            async with session.post(
                url,
                data=make_body(counter),
                headers={"content-type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=60),
            ) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"capacity probe: {url} answered {response.status}")
            answered.append(loop.time())

    measure_from = loop.time() + warmup_s
    await asyncio.gather(*(worker(i) for i in range(connections)))
    in_window = [t for t in answered if measure_from <= t <= stop_at]
    return len(in_window) / duration_s


# -- samplers -------------------------------------------------------------------------------


@dataclass
class ReplicaSamples:
    """vLLM's own gauges, one row per scrape: (seconds since start, running, waiting, kv)."""

    rows: dict[str, list[tuple[float, float, float, float]]] = field(default_factory=dict)
    failures: int = 0

    def mean(self, column: int, since_s: float = 0.0, until_s: float = math.inf) -> float:
        values = [
            row[column]
            for rows in self.rows.values()
            for row in rows
            if since_s <= row[0] <= until_s
        ]
        return sum(values) / len(values) if values else float("nan")

    def maximum(self, column: int, since_s: float = 0.0, until_s: float = math.inf) -> float:
        values = [
            row[column]
            for rows in self.rows.values()
            for row in rows
            if since_s <= row[0] <= until_s
        ]
        return max(values) if values else float("nan")


def parse_vllm_gauges(text: str) -> tuple[float, float, float]:
    """(running, waiting, kv usage) summed over engines (kv: the fullest engine)."""
    running = waiting = kv = 0.0
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name == "vllm:num_requests_running":
            running += float(line.rsplit(" ", 1)[1])
        elif name == "vllm:num_requests_waiting":  # not ..._waiting_by_reason
            waiting += float(line.rsplit(" ", 1)[1])
        elif name == "vllm:kv_cache_usage_perc":
            kv = max(kv, float(line.rsplit(" ", 1)[1]))
    return running, waiting, kv


async def sample_replicas(
    session: aiohttp.ClientSession,
    replicas: Sequence[str],
    interval_s: float,
    into: ReplicaSamples,
    start: float,
) -> None:
    """Scrape every replica's /metrics each ``interval_s`` until cancelled."""
    timeout = aiohttp.ClientTimeout(total=max(interval_s, 0.5))
    loop = asyncio.get_running_loop()

    async def scrape(replica: str) -> None:
        try:
            async with session.get(f"{replica}/metrics", timeout=timeout) as response:
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError):
            into.failures += 1
            return
        running, waiting, kv = parse_vllm_gauges(text)
        into.rows.setdefault(replica, []).append((loop.time() - start, running, waiting, kv))

    next_at = loop.time()
    while True:
        await asyncio.gather(*(scrape(r) for r in replicas))
        next_at += interval_s
        await asyncio.sleep(max(0.0, next_at - loop.time()))


@dataclass
class QueueSamples:
    """The gateway's queue in Valkey, one row per sample: (seconds since start, waiters by
    tenant)."""

    rows: list[tuple[float, Counter[str]]] = field(default_factory=list)

    def mean(self, tenant: str | None = None, since_s: float = 0.0) -> float:
        values = [
            (sum(c.values()) if tenant is None else c.get(tenant, 0))
            for t, c in self.rows
            if t >= since_s
        ]
        return sum(values) / len(values) if values else 0.0

    def maximum(self, tenant: str | None = None) -> int:
        values = [(sum(c.values()) if tenant is None else c.get(tenant, 0)) for _, c in self.rows]
        return max(values, default=0)


async def sample_queue(
    client: avalkey.Valkey, model: str, interval_s: float, into: QueueSamples, start: float
) -> None:
    """Read the pool's queue (who waits, by tenant) each ``interval_s`` until cancelled."""
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while True:
        with contextlib.suppress(Exception):  # a sample missed is no reason to stop
            ids = await client.zrange(keys.queue(model), 0, -1)
            tenants: Counter[str] = Counter()
            if ids:
                async with client.pipeline(transaction=False) as pipe:
                    for request_id in ids:
                        pipe.hget(keys.waiter(request_id.decode(), model), "tenant")
                    for tenant in await pipe.execute():
                        if tenant is not None:
                            tenants[tenant.decode()] += 1
            into.rows.append((loop.time() - start, tenants))
        # valkey's client can swallow a cancel that lands in a long pipeline (turning it into
        # a connection error): the sampler then ran on for minutes with 256 waiters queued.
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        next_at += interval_s
        await asyncio.sleep(max(0.0, next_at - loop.time()))


# -- statistics -----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an unsorted sequence (nan when empty)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one takes everything."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else float("nan")


def max_min_shares(total: float, demands: Sequence[float]) -> list[float]:
    """Water-filling: the max-min fair split of ``total`` among ``demands``."""
    shares = [0.0] * len(demands)
    left = total
    open_ = sorted(range(len(demands)), key=lambda i: demands[i])
    while open_ and left > 1e-9:
        each = left / len(open_)
        i = open_[0]
        if demands[i] <= each:
            shares[i] = demands[i]
            left -= demands[i]
            open_.pop(0)
        else:
            for j in open_:
                shares[j] = each
            left = 0
    return shares


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds the machine spent not idle so far (all cores, steal included)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU cores each named process used between ``start()`` and ``stop()``."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._before: dict[str, float] = {}
        self._machine = 0.0
        self._wall = 0.0
        self.cores: dict[str, float] = {}
        self.machine_cores = 0.0

    def start(self) -> None:
        self._before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._machine = machine_busy_seconds()
        self._wall = time.monotonic()

    def stop(self) -> None:
        wall = time.monotonic() - self._wall
        self.cores = {
            name: (cpu_seconds(pid) - self._before[name]) / wall for name, pid in self.pids.items()
        }
        self.machine_cores = (machine_busy_seconds() - self._machine) / wall

    @property
    def other_cores(self) -> float:
        return max(0.0, self.machine_cores - sum(self.cores.values()))
