"""Async tasks accepted per second by one gateway process (issue 14: ≥ 10,000/s, submit only).

Starts Valkey, one embedding simulator (``--time-scale 0``: only the synchronous comparison
reaches it), a fleet watcher and one gateway process started as the tests start it; publishes
a policy with one embedding model and one key whose use case has limits far above any load
here (so every submit checks and counts its windows, as in production) and a "batch" class.
Then wrk (one thread, ``--connections``) posts one short embeddings body for
``--duration`` seconds, first to ``/v1/async/embeddings`` (each 202 is a task queued in a
stream with its hash: submit.lua's whole work), then the same as bulk submits of ``--bulk``
bodies (one call, one submit.lua, N tasks), then to ``/v1/embeddings`` for comparison
(the synchronous path, through the simulator, in the same run). Nothing drains the queue.

With ``--baseline REF``, a second gateway runs from a checkout of REF (bench/baseline.py)
beside this one, on the same Valkey, simulator and policy, and each async measurement is
taken of both, one after the other: before and after a change, in one run.

    .venv/bin/python -m bench.async_tasks.submit            # writes bench/RESULTS.md
    .venv/bin/python -m bench.async_tasks.submit --no-write [--baseline GIT-REF]

Bounded: under 3 minutes with the defaults (about 40 s on a quiet machine). Stops everything
it started.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import valkey

from bench.baseline import baseline_checkout
from bench.gateway.machine import CpuMeter, CpuUsage, describe, merge_usage, wait_for_quiet
from bench.gateway.stack import GENEROUS_LIMITS
from bench.gateway.wrk import WrkResult, run_wrk, write_script
from bench.gateway.wrk import merge as merge_wrk
from bench.results import write_section
from gateway.async_tasks import layout
from ops.processes import fleet_is_written
from testkit.policy import PolicyBuilder
from testkit.stack import running_stack as running_processes

SECTION = "## Async tasks — submit throughput"
MODEL = "bench-embed"
BODY: dict[str, object] = {"model": MODEL, "input": "The quick brown fox jumps over the lazy dog."}
TARGET = 10_000
QUIET_CORES = 0.3  # what other processes may take during a slice before it is measured again


@dataclass(frozen=True)
class Stack:
    valkey: valkey.Valkey
    pids: dict[str, int]
    base_url: str
    api_key: str
    baseline_url: str | None = None  # the --baseline gateway's


GATEWAY = "gateway"
BASELINE = "gateway (baseline)"


def _publish(client: valkey.Valkey, replica: str) -> str:
    """One embedding model, one key whose use case's limits are far above any load here (so
    every submit checks and counts its windows), and the batch class async tasks run at."""
    policy = PolicyBuilder().model(
        MODEL, [replica], capabilities=("embeddings",), max_in_flight_per_replica=1024
    )
    policy.priority_class("interactive", rank=0, max_queue_length=10_000)
    policy.priority_class(
        "batch", rank=5, queue_timeout_s=300.0, max_queue_length=100_000, max_pool_share=0.5
    )
    plaintext = policy.key(tenant="bench", use_case="async-bench", priority_class="interactive")
    policy.use_case_limits(plaintext, **GENEROUS_LIMITS)
    policy.publish(client)
    return plaintext


@contextlib.contextmanager
def running_stack(logs: Path, baseline_src: Path | None = None) -> Iterator[Stack]:
    with running_processes(logs) as processes:
        store = processes.valkey()
        simulator = processes.simulator(
            MODEL, "--kind", "embedding", "--time-scale", "0", "--max-num-seqs", "1024",
            name="simulator",
        )  # fmt: skip
        api_key = _publish(store.client, simulator.base_url)
        env = {"SWITCHYARD_VALKEY_URL": store.url}
        watcher = processes.fleet_watcher(env, ready=fleet_is_written(store.client))
        gateway = processes.gateway(
            # Nothing drains the queue here: a bound no run reaches.
            {**env, "SWITCHYARD_ASYNC_MAX_BACKLOG": "1000000000"},
            name="gateway",
        )
        pids = {
            GATEWAY: gateway.process.pid,
            "valkey": store.pid,
            "simulator": simulator.process.pid,
            "fleet watcher": watcher.pid,
        }
        baseline_url = None
        if baseline_src is not None:
            # Its own packages first (the editable install's finder comes after sys.path).
            baseline = processes.gateway(
                {
                    **env,
                    "SWITCHYARD_ASYNC_MAX_BACKLOG": "1000000000",
                    "PYTHONPATH": str(baseline_src),
                },
                name="gateway-baseline",
                cwd=baseline_src,
            )
            pids[BASELINE] = baseline.process.pid
            baseline_url = baseline.base_url
        yield Stack(
            valkey=store.client,
            pids=pids,
            base_url=gateway.base_url,
            api_key=api_key,
            baseline_url=baseline_url,
        )


@dataclass(frozen=True)
class Run:
    path: str
    wrk: WrkResult
    cpu: CpuUsage
    queued: int  # tasks found queued afterwards (async) or 0
    tasks_per_request: int = 1  # a bulk submit's bodies
    gateway: str = GATEWAY  # which gateway process answered: this checkout's or the baseline's

    def cpu_per_request_us(self, name: str) -> float:
        return self.cpu.by_process.get(name, 0.0) / max(1, self.wrk.ok_requests) * 1e6

    def cpu_per_task_us(self, name: str) -> float:
        return self.cpu_per_request_us(name) / self.tasks_per_request

    @property
    def tasks_per_s(self) -> float:
        return self.wrk.requests_per_s * self.tasks_per_request

    @property
    def label(self) -> str:
        label = f"`{self.path}`"
        if self.tasks_per_request != 1:
            label += f", bulk of {self.tasks_per_request}"
        return label + (", baseline" if self.gateway == BASELINE else "")


def _queued(client: valkey.Valkey) -> int:
    depth = cast(bytes | None, client.get(layout.depth(MODEL)))
    return int(depth or 0)


def measure(
    stack: Stack,
    script: Path,
    path: str,
    args: argparse.Namespace,
    *,
    bulk: int = 1,
    gateway: str = GATEWAY,
) -> Run:
    """``--slices`` slices of wrk, each after the machine is quiet (other helpers and tests
    share it); a slice during which others took more than ``QUIET_CORES`` is measured again
    (once), and the quieter of the two kept."""
    base_url = stack.baseline_url if gateway == BASELINE else stack.base_url
    assert base_url is not None
    url = base_url + path
    run_wrk(url, script, connections=args.connections, duration_s=args.warmup)
    slices: list[tuple[WrkResult, CpuUsage, int]] = []
    for _ in range(args.slices):
        best: tuple[WrkResult, CpuUsage, int] | None = None
        for _attempt in range(2):
            wait_for_quiet(stack.pids, max_wait_s=5, threshold_cores=QUIET_CORES)
            before = _queued(stack.valkey)
            meter = CpuMeter(stack.pids)
            result = run_wrk(
                url, script, connections=args.connections, duration_s=args.duration / args.slices
            )
            cpu = meter.stop(extra={"wrk": result.cpu_s})
            measured = (result, cpu, _queued(stack.valkey) - before)
            if best is None or cpu.other_cores < best[1].other_cores:
                best = measured
            if cpu.other_cores <= QUIET_CORES:
                break
        assert best is not None
        slices.append(best)
    return Run(
        path,
        merge_wrk([s[0] for s in slices]),
        merge_usage([s[1] for s in slices]),
        sum(s[2] for s in slices),
        bulk,
        gateway,
    )


def report(runs: list[Run], machine: dict[str, str], args: argparse.Namespace) -> str:
    submit, bulk, sync = (run for run in runs if run.gateway == GATEWAY)
    baselines = [run for run in runs if run.gateway == BASELINE]

    def verdict(run: Run) -> str:
        return "met" if run.tasks_per_s >= TARGET and run.wrk.errors == 0 else "not met"

    lines = [
        SECTION,
        "",
        "Tasks accepted per second by one gateway process: `POST /v1/async/embeddings` with one",
        "short body, every submit authenticated, validated, estimated and admitted by one",
        "submit.lua call (the use case's windows checked and counted, the backlog bound",
        "checked, the task XADDed to its partition stream and its hash written with a TTL);",
        f"then bulk submits of {args.bulk} such bodies (a JSON array: one call, one submit.lua,",
        f"{args.bulk} tasks, all or none). Nothing drains the queue. The synchronous",
        "`/v1/embeddings` of the same body, in the same run, through the embedding simulator",
        "at `--time-scale 0`, is there to compare. Reproduce with:",
        "",
        "```",
        ".venv/bin/python -m bench.async_tasks.submit",
        "```",
        "",
        f"wrk {machine['wrk']}, one thread, -c{args.connections}, {args.duration} s in "
        f"{args.slices} slices after {args.warmup} s of warm-up (each slice once the machine is "
        f"quiet; one during which other processes took more than {QUIET_CORES} cores is "
        "measured again, once, and the quieter kept), on the same "
        f"{machine['nproc']} cores as everything else "
        f"({machine['cpu']}, Python {machine['python']}, uvicorn {machine['uvicorn']}, uvloop "
        f"{machine['uvloop']}). Gateway commit {machine['commit']}. Measured "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "| target | measured | |",
        "| --- | ---: | --- |",
        f"| ≥ {TARGET:,} tasks accepted/s, one gateway process, submit only: one task a call | "
        f"{submit.tasks_per_s:,.0f} | {verdict(submit)} |",
        f"| the same, bulk submits of {args.bulk} | {bulk.tasks_per_s:,.0f} | {verdict(bulk)} |",
        "",
        "| path | calls/s | tasks/s | p50 | p99 | errors | tasks queued | gateway CPU/task | "
        "Valkey CPU/task | gateway | valkey | wrk | machine | other |",
        "| --- " + "| ---: " * 13 + "|",
    ]
    for run in runs:
        lines.append(
            f"| {run.label} | {run.wrk.requests_per_s:,.0f} | "
            f"{run.tasks_per_s:,.0f} | "
            f"{run.wrk.p50_ms:.2f} ms | "
            f"{run.wrk.p99_ms:.2f} ms | {run.wrk.errors} | "
            f"{run.queued:,} | "
            f"{run.cpu_per_task_us(run.gateway):.0f} µs | "
            f"{run.cpu_per_task_us('valkey'):.0f} µs | "
            f"{run.cpu.cores(run.gateway):.2f} | {run.cpu.cores('valkey'):.2f} | "
            f"{run.cpu.cores('wrk'):.2f} | {run.cpu.machine_cores:.2f} | "
            f"{run.cpu.other_cores:.2f} |"
        )
    per_task_us = sum(submit.cpu_per_task_us(name) for name in ("gateway", "valkey", "wrk"))
    cores = int(machine["nproc"])
    lines += [
        "",
        f"What bounds it: each task submitted alone cost {per_task_us:.0f} µs of CPU across the "
        f"gateway ({submit.cpu_per_task_us('gateway'):.0f} µs), Valkey "
        f"({submit.cpu_per_task_us('valkey'):.0f} µs) and wrk: {cores} cores, with nothing "
        f"else running, could accept at most {cores / per_task_us * 1e6:,.0f} tasks/s; the "
        "gateway process alone, with a core to itself, "
        f"{1e6 / max(1.0, submit.cpu_per_task_us('gateway')):,.0f}/s. Most of a single "
        "submit's cost is per call (HTTP, authentication, the script call's round trip), not "
        f"per task: in bulks of {args.bulk} a task costs the gateway "
        f"{bulk.cpu_per_task_us('gateway'):.0f} µs and Valkey "
        f"{bulk.cpu_per_task_us('valkey'):.0f} µs. A client with many tasks should send them "
        "in bulk (the async client's `submit_many`); one that cannot gets about the single "
        "rate per gateway process, and gateways scale out (they share nothing but Valkey).",
    ]
    for base in baselines:
        this = submit if base.tasks_per_request == 1 else bulk
        lines += [
            "",
            f"Against the baseline ({args.baseline}, the same load in the same run), "
            f"{this.label}: {this.tasks_per_s / max(1.0, base.tasks_per_s) - 1:+.0%} tasks/s "
            f"({this.tasks_per_s:,.0f} vs {base.tasks_per_s:,.0f}), gateway CPU "
            f"{this.cpu_per_task_us(GATEWAY):.0f} vs {base.cpu_per_task_us(BASELINE):.0f} µs a "
            "task.",
        ]
    lines += [
        "",
        'CPU columns are cores (CPU seconds per wall second); "other" is what processes not',
        "ours took meanwhile. \"Tasks queued\" is the model's depth counter's growth during the",
        "measured seconds (warm-up excluded): every accepted task is one queued task. The",
        f"synchronous figure is {sync.wrk.requests_per_s / max(1.0, submit.wrk.requests_per_s):.0%}"
        " of the single async one; it also pays the upstream call and the simulator shares the",
        "cores.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--duration", type=int, default=10, help="measured seconds per path")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up seconds per path")
    parser.add_argument("--slices", type=int, default=5, help="slices the duration is cut in")
    parser.add_argument("--connections", type=int, default=64, help="wrk -c")
    parser.add_argument("--bulk", type=int, default=10, help="bodies in one bulk submit")
    parser.add_argument("--no-write", action="store_true", help="print, do not write RESULTS")
    parser.add_argument(
        "--baseline", metavar="GIT-REF", help="also measure a gateway from this commit, alike"
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")
    with (
        tempfile.TemporaryDirectory(prefix="switchyard-async-bench-") as tmp,
        baseline_checkout(args.baseline) as baseline_src,
        running_stack(Path(tmp), baseline_src) as stack,
    ):
        headers = {
            "Authorization": f"Bearer {stack.api_key}",
            "Content-Type": "application/json",
        }
        script = write_script(Path(tmp) / "embed.lua", BODY, headers)
        bulk_script = write_script(Path(tmp) / "bulk.lua", [BODY] * args.bulk, headers)
        gateways = [GATEWAY] + ([BASELINE] if stack.baseline_url else [])
        runs = [
            *(measure(stack, script, "/v1/async/embeddings", args, gateway=g) for g in gateways),
            *(
                measure(stack, bulk_script, "/v1/async/embeddings", args, bulk=args.bulk, gateway=g)
                for g in gateways
            ),
            measure(stack, script, "/v1/embeddings", args),
        ]
    text = report(runs, describe(), args)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
