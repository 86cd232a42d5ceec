"""Async bulk submits with request guardrails: tasks accepted per second (issue 26: ≥ 1,000/s
for a bulk submit with the demo's guardrails, its bodies checked as one batch).

Starts Valkey, an embedding simulator (``--time-scale 0``; nothing drains the queue, so it is
never asked), a fleet watcher, the real guardrail service (the real detectors, ``--workers``
processes, the checks below preloaded) and one gateway process from this checkout; with
``--baseline REF`` (default ``HEAD``) a second gateway from a ``git archive`` of REF (nothing
in the repository changes), on the same Valkey and the same guardrail service: the gateway
before the change, which checks a bulk's bodies one after the other.

Each scenario is a use case with request guardrails (ops/demo.py's request-stage selections
that run in guardrail workers, or a part of them) and a kind of ~1 KB body:

- ``demo``: secrets block, invisible text redact, PII redact, prompt injection flag, on
  ordinary business prose (what a bank's batch jobs send: the injection check's rule layer
  decides it without the classifier);
- ``demo-no-injection``: the same without prompt injection;
- ``rules``: secrets and invisible text only (the rule-based checks: the gateway's and the
  service's own cost per body);
- ``demo-eval``: the demo's checks on prompts joined from the evaluation set (names for PII,
  injections and look-alikes that reach the injection check's classifier).

For each scenario, bulk size and gateway, ``--in-flight`` clients post bulks back to back
(every body different) for ``--seconds`` (at least one bulk each); tasks/s is bodies
accepted (202) over the wall time. The figures go to ``--write`` (default
bench/results/async_intake_guarded.md).

    .venv/bin/python -m bench.async_tasks.guarded [--scenarios demo,rules] [--bulks 100,1000]
        [--seconds 10] [--workers 2] [--baseline HEAD | --no-baseline] [--write FILE]

Bounded: every request has a client timeout (``--timeout``), and every process is stopped on
the way out. Machine: whatever it runs on; the load generator shares its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

import httpx
import orjson
import psutil
import valkey

from bench.gateway.machine import CpuMeter, CpuUsage, describe, merge_usage
from ops.processes import fleet_is_written
from testkit.guardrail_quality import load_prompts
from testkit.policy import PolicyBuilder
from testkit.stack import running_stack

MODEL = "bench-embed-guarded"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_WRITE = REPO / "bench" / "results" / "async_intake_guarded.md"
TARGET = 1_000
Action = Literal["block", "redact", "flag"]

DEMO = (
    ("secrets", "block"),
    ("invisible_text", "redact"),
    ("pii", "redact"),
    ("prompt_injection", "flag"),
)
SCENARIOS: dict[str, tuple[tuple[tuple[str, str], ...], str]] = {
    "demo": (DEMO, "prose"),
    "demo-no-injection": (DEMO[:3], "prose"),
    "rules": (DEMO[:2], "prose"),
    "demo-eval": (DEMO, "eval"),
}
_PROSE = (
    "Please summarise the quarterly report for the board.",
    "Revenue grew in all regions while costs stayed flat.",
    "The team expects the trend to continue next quarter.",
    "Branch openings in the north were delayed by planning rules.",
    "Customer complaints about card payments fell by a fifth.",
    "The savings product will be repriced after the rate decision.",
    "Mortgage applications rose in the spring and eased in summer.",
    "Operational losses were within the appetite set by the committee.",
)


def prose(index: int, size: int = 1024) -> str:
    """About ``size`` bytes of ordinary business prose, different for every ``index``."""
    words, at = [f"Item {index}."], index
    while sum(len(w) + 1 for w in words) < size - 70:
        words.append(_PROSE[at % len(_PROSE)])
        at = at * 7 + 3
    return " ".join(words)[:size]


def body_texts(kind: str, count: int) -> list[str]:
    if kind == "prose":
        return [prose(i) for i in range(count)]
    return [f"{i}. {text}"[:1024] for i, text in enumerate(evaluation_prompts(count))]


def evaluation_prompts(count: int, size: int = 1000) -> list[str]:
    """~``size`` bytes each, joined from the evaluation set's prompts (each start a different
    one): names to redact, injections and their look-alikes for the injection check's rules
    and classifier. None about secrets: a body the demo's secrets check blocks would refuse
    the whole bulk."""
    pool = [
        p["text"]
        for p in load_prompts()
        if not p["id"].startswith("secrets") and "secrets" not in p["expect"]
    ]
    out = []
    for n in range(count):
        parts: list[str] = []
        at = n
        while sum(len(part.encode()) + 1 for part in parts) < size - 100:
            parts.append(pool[at % len(pool)])
            at += 1
        out.append(" ".join(parts))
    return out


@dataclass(frozen=True)
class Result:
    scenario: str
    gateway: str  # "after" (this checkout) or "before" (the baseline)
    bulk: int
    bulks: int
    accepted: int
    refused: dict[int, int]
    seconds: float
    p50_bulk_s: float
    cpu: CpuUsage  # by process: gateway, guardrail service, its workers, valkey, load generator

    def cpu_per_task_ms(self, name: str) -> float:
        """CPU a body submitted (accepted or not), idle background included."""
        return self.cpu.by_process.get(name, 0.0) / max(1, self.bulks * self.bulk) * 1000

    @property
    def tasks_per_s(self) -> float:
        return self.accepted / self.seconds if self.seconds else 0.0


def _workers(pid: int) -> dict[str, int]:
    """The guardrail service's worker processes (not multiprocessing's resource tracker)."""
    children = psutil.Process(pid).children()
    spawned = [c.pid for c in children if "spawn_main" in " ".join(c.cmdline())]
    return {f"worker {n}": child for n, child in enumerate(spawned)}


@dataclass
class Row:
    """One gateway's slices of one scenario and bulk size, added up."""

    accepted: int = 0
    bulks: int = 0
    seconds: float = 0.0
    refused: dict[int, int] = field(default_factory=dict)
    took: list[float] = field(default_factory=list)
    usage: list[CpuUsage] = field(default_factory=list)

    def add(
        self,
        args: argparse.Namespace,
        url: str,
        key: str,
        texts: list[str],
        bulk: int,
        seconds: float,
        pids: dict[str, int],
    ) -> None:
        meter = CpuMeter(pids)
        accepted, bulks, refused, took_s, took = asyncio.run(
            load(url, key, texts, bulk, seconds, args.in_flight, args.timeout)
        )
        cpu = meter.stop()
        cpu.by_process["workers"] = sum(
            v for k, v in cpu.by_process.items() if k.startswith("worker ")
        )
        self.accepted += accepted
        self.bulks += bulks
        self.seconds += took_s
        for status, count in refused.items():
            self.refused[status] = self.refused.get(status, 0) + count
        self.took += took
        self.usage.append(cpu)

    def result(self, scenario: str, label: str, bulk: int) -> Result:
        took = sorted(self.took)
        return Result(
            scenario,
            label,
            bulk,
            self.bulks,
            self.accepted,
            self.refused,
            self.seconds,
            took[len(took) // 2],
            merge_usage(self.usage),
        )


@contextlib.contextmanager
def archived(ref: str | None) -> Iterator[Path | None]:
    """A ``git archive`` of ``ref`` unpacked in a temporary directory (read-only on the
    repository: no worktree, no checkout)."""
    if ref is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="switchyard-guarded-baseline-") as parent:
        tar = Path(parent) / "src.tar"
        with tar.open("wb") as out:
            subprocess.run(["git", "-C", str(REPO), "archive", ref], stdout=out, check=True)
        path = Path(parent) / "src"
        with tarfile.open(tar) as archive:
            archive.extractall(path, filter="data")
        yield path


async def load(
    url: str,
    key: str,
    texts: list[str],
    bulk: int,
    seconds: float,
    in_flight: int,
    client_timeout_s: float,
) -> tuple[int, int, dict[int, int], float, list[float]]:
    """Bulks back to back from ``in_flight`` clients for ``seconds`` (at least one each)."""
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    accepted, bulks, refused, took = 0, 0, dict[int, int](), list[float]()
    next_text = 0
    started = time.monotonic()

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal accepted, bulks, next_text
        while True:
            at, next_text = next_text, next_text + bulk
            documents = [
                {"model": MODEL, "input": texts[(at + i) % len(texts)]} for i in range(bulk)
            ]
            # A bulk of 1 is a plain submit (one JSON object): the single-body path.
            body = documents[0] if bulk == 1 else documents
            sent = time.monotonic()
            response = await http.post(url, content=orjson.dumps(body), headers=headers)
            took.append(time.monotonic() - sent)
            bulks += 1
            if response.status_code == 202:
                accepted += bulk
            else:
                refused[response.status_code] = refused.get(response.status_code, 0) + 1
            if time.monotonic() - started >= seconds:
                return

    async with httpx.AsyncClient(timeout=client_timeout_s) as http:
        await asyncio.gather(*(client(http) for _ in range(in_flight)))
    return accepted, bulks, refused, time.monotonic() - started, took


def publish(client: valkey.Valkey, replica: str, scenarios: list[str]) -> dict[str, str]:
    """One embedding model and, for each scenario, a key whose use case has its checks."""
    policy = PolicyBuilder().model(
        MODEL, [replica], capabilities=("embeddings",), max_in_flight_per_replica=1024
    )
    policy.priority_class("interactive", rank=0, max_queue_length=10_000)
    policy.priority_class("batch", rank=5, queue_timeout_s=300.0, max_queue_length=100_000)
    keys = {}
    for scenario in scenarios:
        key = policy.key(tenant="bench", use_case=scenario, priority_class="interactive")
        for guardrail, action in SCENARIOS[scenario][0]:
            policy.guardrail(key, guardrail, side="request", action=cast(Action, action))
        keys[scenario] = key
    policy.publish(client)
    return keys


def measure(args: argparse.Namespace) -> list[Result]:
    results: list[Result] = []
    names = {name for scenario in args.scenarios for name, _ in SCENARIOS[scenario][0]}
    with (
        tempfile.TemporaryDirectory(prefix="switchyard-guarded-bench-") as tmp,
        archived(args.baseline) as baseline_src,
        running_stack(Path(tmp)) as processes,
    ):
        store = processes.valkey()
        simulator = processes.simulator(
            MODEL, "--kind", "embedding", "--time-scale", "0", "--max-num-seqs", "1024"
        )
        env = {"SWITCHYARD_VALKEY_URL": store.url}
        service = processes.guardrail_service(
            {
                "SWITCHYARD_GUARDRAIL_WORKERS": str(args.workers),
                "SWITCHYARD_GUARDRAIL_PRELOAD": ",".join(sorted(names)),
            },
            timeout=300,
        )
        keys = publish(store.client, simulator.base_url, args.scenarios)
        processes.fleet_watcher(env, ready=fleet_is_written(store.client))
        gateway_env = {
            **env,
            "SWITCHYARD_ASYNC_MAX_BACKLOG": "1000000000",
            "SWITCHYARD_GUARDRAIL_URL": service.url,
        }
        after = processes.gateway(gateway_env, name="gateway")
        gateways = {"after": after.base_url}
        gateway_pids = {"after": after.process.pid}
        if baseline_src is not None:
            before = processes.gateway(
                {**gateway_env, "PYTHONPATH": str(baseline_src)},
                name="gateway-baseline",
                cwd=baseline_src,
            )
            gateways["before"] = before.base_url
            gateway_pids["before"] = before.process.pid
        for scenario in args.scenarios:
            _, kind = SCENARIOS[scenario]
            for bulk in args.eval_bulks if kind == "eval" else args.bulks:
                texts = body_texts(kind, max(bulk * 4, 400))
                # Warm-up: one small bulk each (the detectors' first calls, the pools).
                for base_url in gateways.values():
                    url = base_url + "/v1/async/embeddings"
                    asyncio.run(load(url, keys[scenario], texts, 10, 0, 1, args.timeout))
                # The gateways take turns, slice by slice, so that what others do to the
                # machine meanwhile falls on both alike (a large bulk: one slice each).
                slices = args.slices if bulk <= 100 else 1
                rows = {label: Row() for label in gateways}
                for _ in range(slices):
                    for label, base_url in gateways.items():
                        rows[label].add(
                            args,
                            base_url + "/v1/async/embeddings",
                            keys[scenario],
                            texts,
                            bulk,
                            args.seconds / slices,
                            {
                                "gateway": gateway_pids[label],
                                "service": service.process.pid,
                                "valkey": store.pid,
                                "load": os.getpid(),
                                **_workers(service.process.pid),
                            },
                        )
                for label, row in rows.items():
                    result = row.result(scenario, label, bulk)
                    print(
                        f"{scenario} bulk={bulk} {label}: {result.tasks_per_s:,.1f} tasks/s "
                        f"({result.bulks} bulks, p50 {result.p50_bulk_s:.2f} s, "
                        f"refused {result.refused})",
                        flush=True,
                    )
                    results.append(result)
    return results


def render(results: list[Result], args: argparse.Namespace, started: datetime.datetime) -> str:
    machine = describe()
    lines = [
        "# Async intake with request guardrails — bulk submits",
        "",
        "Tasks accepted per second by one gateway process for async bulk submits",
        "(`POST /v1/async/embeddings`, a JSON array of ~1 KB bodies, every body different),",
        f"with the use case's request guardrails run by the real guardrail service ({args.workers}",
        "worker processes, the real detectors). *after*: this checkout, a bulk's bodies checked",
        "as one batch (one `/v1/check/bulk` call the service shares out over its workers);",
        f"*before*: a gateway from `{args.baseline}`, which checks the bodies one after the other",
        "(one `/v1/check` each), on the same Valkey and guardrail service in the same run.",
        f"{args.in_flight} bulk(s) in flight, back to back, for {args.seconds:g} s a row (at",
        "least one bulk), after one bulk of 10 to warm up; the two gateways take turns in",
        f"{args.slices} slices (bulks of up to 100; larger: one turn each), so that what other",
        "processes do to the machine meanwhile falls on both alike. A bulk of 1 is a plain",
        "submit (one JSON object: the single-body path). Reproduce:",
        "",
        "```",
        ".venv/bin/python -m bench.async_tasks.guarded",
        "```",
        "",
        f"Machine: {machine['nproc']} CPUs, {machine['cpu']}, Python {machine['python']}; the",
        "load generator, Valkey, the gateway(s) and the guardrail workers share them. Commit "
        f"{machine['commit']}, "
        f"{started.strftime('%Y-%m-%d %H:%M UTC')}.",
        "",
        "| scenario | checks | bulk | gateway | tasks/s | bulks | p50 a bulk | refused | "
        "CPU ms a task: gateway | guardrail service | its workers | Valkey | load | "
        "cores busy |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    for r in results:
        checks = ", ".join(name for name, _ in SCENARIOS[r.scenario][0])
        refused = ", ".join(f"{status}: {n}" for status, n in sorted(r.refused.items())) or "0"
        lines.append(
            f"| {r.scenario} | {checks} | {r.bulk:,} | {r.gateway} | {r.tasks_per_s:,.1f} | "
            f"{r.bulks} | {r.p50_bulk_s:.2f} s | {refused} | "
            + " | ".join(
                f"{r.cpu_per_task_ms(name):.2f}"
                for name in ("gateway", "service", "workers", "valkey", "load")
            )
            + f" | {r.cpu.machine_cores:.2f} |"
        )
    lines += ["", *_capacity(results), ""]
    return "\n".join(lines)


_OURS = ("gateway", "service", "workers", "valkey")


def _capacity(results: list[Result]) -> list[str]:
    """What the CPU a task costs allows, whatever else shared the machine during the run: per
    scenario, from this checkout's largest bulk."""
    lines = [
        "What the CPU a task costs allows (this checkout, each scenario's largest bulk; the",
        "cores the gateway, the guardrail service, its workers and Valkey take for 1,000 tasks/s,",
        "their idle background included, the load generator not):",
        "",
    ]
    for scenario in dict.fromkeys(r.scenario for r in results):
        rows = [r for r in results if r.scenario == scenario and r.gateway == "after"]
        if not rows:
            continue
        r = max(rows, key=lambda row: row.bulk)
        total_ms = sum(r.cpu_per_task_ms(name) for name in _OURS)
        workers_ms = r.cpu_per_task_ms("workers")
        lines.append(
            f"- `{scenario}` (bulks of {r.bulk:,}): {total_ms:.2f} ms of CPU a task, "
            f"{workers_ms:.2f} ms of it in the guardrail workers: {1000 / total_ms:,.0f} "
            f"tasks/s a core; {TARGET:,} tasks/s needs {TARGET * total_ms / 1000:.1f} cores "
            f"({TARGET * workers_ms / 1000:.1f} of them guardrail workers)."
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--scenarios", default="rules,demo,demo-no-injection,demo-eval")
    parser.add_argument(
        "--bulks", default="1,100,1000", help="bodies a bulk, comma-separated (1: plain submits)"
    )
    parser.add_argument(
        "--eval-bulks", default="100", help="--bulks of demo-eval (its bodies cost the most)"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="per row, at least a bulk")
    parser.add_argument("--in-flight", type=int, default=1, help="bulks in flight at once")
    parser.add_argument(
        "--slices", type=int, default=5, help="turns the gateways take (bulks of ≤ 100)"
    )
    parser.add_argument("--workers", type=int, default=2, help="guardrail worker processes")
    parser.add_argument("--timeout", type=float, default=600.0, help="client timeout a bulk")
    parser.add_argument("--baseline", default="HEAD", help="git ref of the 'before' gateway")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--write", type=Path, default=DEFAULT_WRITE)
    args = parser.parse_args()
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    args.bulks = [int(b) for b in args.bulks.split(",") if b]
    args.eval_bulks = [int(b) for b in args.eval_bulks.split(",") if b]
    if args.no_baseline:
        args.baseline = None
    started = datetime.datetime.now(datetime.UTC)
    text = render(measure(args), args, started)
    print(text)
    args.write.parent.mkdir(parents=True, exist_ok=True)
    args.write.write_text(text)


if __name__ == "__main__":
    main()
