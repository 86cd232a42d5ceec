"""The "Gateway" section of bench/RESULTS.md: method, machine, figures, targets."""

from __future__ import annotations

import argparse
import datetime
import re
from pathlib import Path

from .loadgen import LoadResult, percentile
from .measurements import Measurements, Sampled, Saturation

# "direct" is the first replica answering with nothing in between; the relays go to it too.
PATHS = ("direct", "relay-aiohttp", "relay-switchyard", "gateway")
# The gateway of another commit, measured beside this one (``--baseline``).
BASELINE = "gateway-baseline"
LABELS = {
    "direct": "direct",
    "relay-aiohttp": "relay, aiohttp",
    "relay-switchyard": "relay, switchyard client",
    "gateway": "gateway",
    BASELINE: "gateway, baseline",
}


def _paths(m: Measurements) -> tuple[str, ...]:
    return (*PATHS, BASELINE) if BASELINE in m.latency else PATHS


# The targets the gateway is held to.
TARGET_RPS = 2500
TARGET_ADDED_P50_MS = 0.8
TARGET_ADDED_OPEN_P99_MS = 3.0
# The throughput target's own terms: at least this share of the bare aiohttp relay's
# requests/s (the reference relay).
TARGET_RELAY_SHARE = 0.30
# What the bare aiohttp relay costs a request on the machine the targets were set on (ms of
# CPU), against a fake vLLM that answers at once.
REFERENCE_RELAY_CPU_MS = 0.12
# What the simulator costs a request with --time-scale 0 on this machine kind (ms of CPU).
SIMULATOR_CPU_MS = 0.25
# Below this, the gateway made no Valkey call per request: admission was not in the path.
ADMISSION_CALLS_PER_REQUEST = 0.5
# wrk at this share of its one thread, or a server at this share of its one core (steal and
# wake-ups keep a busy process on a shared VM from showing a full core), was the
# limit of a saturation run.
SATURATED_CORE = 0.8
# Other work on the machine above this many cores makes a figure pessimistic.
BUSY_MACHINE_CORES = 0.2

METHOD = """\
What one gateway process adds to a request: a replica ({upstream_short}) asked directly,
through two bare relays (`bench/gateway/bare_relay.py`: the same uvicorn + uvloop +
httptools and one pooled upstream client, no logic; one with aiohttp, the issue's reference
relay, one with the gateway's own fleet client, `gateway/upstream.py`) and through the
gateway. Reproduce with:

```
.venv/bin/python -m bench.gateway.overhead{flag}
```

It starts Valkey, {upstream_long}, a policy snapshot (one model on both replicas, one key
whose use case has limits far above any load here), one gateway process started as the
tests start it, and the two relays (to the first replica). Requests are short chat
completions (`max_tokens` 4). Saturation is wrk {wrk} with one thread; one connection and the
open loop ({rate:g} requests/s on a fixed schedule, latency from each request's due time, so
no coordinated omission) are `bench/gateway/loadgen.py`, which keeps every sample. Each
measurement runs in {rounds} slices that take turns between the paths, each after {warmup:g} s
of warm-up, so that other work on this shared machine falls on all four alike; a slice
during which other work took more than {retry_above:g} cores is measured again (at most
{retry_budget:g} s in all) and the quieter one kept. "Added" is a path's percentile minus
direct's (the first replica answering with nothing in between). CPU columns are cores (CPU
seconds per wall second, from /proc); "other" is what processes not ours (and the
hypervisor's steal) took meanwhile.
"""

UPSTREAM_SHORT = {
    "instant": "a fake vLLM that answers at once",
    "simulator": "the simulator, held to real vLLM",
}
UPSTREAM_LONG = {
    "instant": (
        "two fake vLLM replicas that answer at once (`bench/gateway/instant_vllm.py`: canned "
        "answers shaped as vLLM 0.32's, at next to no CPU; the upstream the issue's targets "
        "are defined against)"
    ),
    "simulator": (
        "two simulator replicas with `--time-scale 0` (they spend about "
        f"{SIMULATOR_CPU_MS} ms of CPU a request on the same cores as everything else, so "
        "every path here is slower than against a fake vLLM that answers at once, the "
        "upstream the issue's targets are defined against)"
    ),
}


ROUTING = """\
Issue 27: the same measurements with routing on. The model has two versions (v1 on the first
replica, v2 on the second) split 95/5 per request with an alias, and the use case a fallback
chain for it: what a request pays is the version choice at the front door and the fallback
lookup. The baseline, from before versions, reads the same snapshot and serves the model on
both replicas without a split (the snapshot keeps that entry for gateways mid-upgrade).
Reproduce with `--routing --baseline <commit>`.
"""


def title(args: argparse.Namespace) -> str:
    """The RESULTS.md section this run writes."""
    return "Gateway — routing on" if getattr(args, "routing", False) else "Gateway"


def render(
    m: Measurements,
    *,
    machine: dict[str, str],
    args: argparse.Namespace,
    started: datetime.datetime,
) -> str:
    nproc = int(machine["nproc"])
    upstream: str = args.upstream
    method = METHOD.format(
        upstream_short=UPSTREAM_SHORT[upstream],
        upstream_long=UPSTREAM_LONG[upstream],
        flag="" if upstream == "instant" else f" --upstream {upstream}",
        wrk=machine["wrk"],
        rate=args.rate,
        rounds=args.rounds,
        warmup=args.warmup,
        retry_above=args.retry_above,
        retry_budget=args.retry_budget,
    )
    lines = [
        f"## {title(args)}",
        "",
        *(ROUTING.splitlines() if args.routing else ()),
        method,
        f"Machine: {machine['nproc']} CPUs (`nproc`), {machine['cpu']}, Python "
        f"{machine['python']}, uvicorn {machine['uvicorn']}, uvloop {machine['uvloop']}, "
        f"httptools {machine['httptools']}, aiohttp {machine['aiohttp']}; the load generator "
        f"shares the cores with everything else. Gateway commit {machine['commit']}. "
        f"Measured {started:%Y-%m-%d %H:%M} UTC.",
        "",
        "### Against the targets",
        "",
        *_targets(m, upstream=upstream, nproc=nproc),
        "",
        *_against_baseline(m, args),
        f"### Latency at one connection (closed loop, {args.latency_seconds:g} s per path)",
        "",
        "| path | p50 | p99 | added p50 | added p99 | requests/s | other |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    base = m.latency["direct"].load
    for name in _paths(m):
        one = m.latency[name]
        lines.append(
            f"| {LABELS[name]} | {_ms(one.load.percentile(50))} | {_ms(one.load.percentile(99))} "
            f"| {_added(one.load, base, 50, name)} | {_added(one.load, base, 99, name)} "
            f"| {one.load.requests_per_s:,.0f} | {one.cpu.other_cores:.2f} |"
        )
    lines += [
        "",
        f"### Throughput at saturation (wrk -c{args.connections}, {args.seconds:g} s per path)",
        "",
        'p50 and p99 are the means of the slices\'. "Serving process" is the CPU of the',
        'process that answered: the first replica (direct), the relay or the gateway; "CPU',
        'per request" is its CPU time divided by the requests answered; "limit" is what ran',
        "out.",
        "",
        "| scenario | path | requests/s | p50 | p99 | errors | serving process | CPU per "
        "request | wrk | machine | other | limit |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for scenario, runs in (("plain", m.saturation), ("SSE, include_usage", m.streaming)):
        for name in _paths(m):
            run = runs[name]
            per_request_ms = _cpu_per_request_ms(run)
            lines.append(
                f"| {scenario} | {LABELS[name]} | {run.wrk.requests_per_s:,.0f} "
                f"| {_ms(run.wrk.p50_ms)} | {_ms(run.wrk.p99_ms)} | {run.wrk.errors} "
                f"| {run.cpu.cores(run.serving_process):.2f} | {per_request_ms:.3f} ms "
                f"| {run.cpu.cores('load generator'):.2f} | {run.cpu.machine_cores:.2f} "
                f"| {run.cpu.other_cores:.2f} | {_limit(run, nproc)} |"
            )
    gateway_run = m.saturation["gateway"]
    lines += [
        "",
        "Valkey commands per gateway request at saturation (plain): "
        f"{gateway_run.valkey_commands_per_request:.2f}. CPU per gateway request, by "
        f"process: {_cpu_by_process(gateway_run)}.",
        "",
        f"### Open loop at {args.rate:g} requests/s ({args.open_loop_seconds:g} s per path)",
        "",
        "| path | answered | p50 | p99 | p99.9 | max | added p50 | added p99 | errors "
        "| generator lag p99 | generator | other |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    base_open = m.open_loop["direct"].load
    for name in _paths(m):
        run_open = m.open_loop[name]
        r = run_open.load
        lines.append(
            f"| {LABELS[name]} | {r.completed:,}/{r.scheduled:,} | {_ms(r.percentile(50))} "
            f"| {_ms(r.percentile(99))} | {_ms(r.percentile(99.9))} | {_ms(r.percentile(100))} "
            f"| {_added(r, base_open, 50, name)} | {_added(r, base_open, 99, name)} "
            f"| {r.errors} | {_ms(percentile(r.send_lag_ms, 99))} "
            f"| {run_open.cpu.cores('load generator'):.2f} | {run_open.cpu.other_cores:.2f} |"
        )
    lines += ["", _generator_note(m, nproc), "", _references(m, upstream=upstream)]
    return "\n".join(lines) + "\n"


def _against_baseline(m: Measurements, args: argparse.Namespace) -> list[str]:
    """This gateway against the baseline commit's, same run: the change's own cost."""
    if BASELINE not in m.latency:
        return []

    def row(figure: str, now: float, before: float, unit: str, digits: int = 0) -> str:
        change = (now - before) / before if before else 0.0
        suffix = f" {unit}" if unit else ""
        return (
            f"| {figure} | {now:,.{digits}f}{suffix} | {before:,.{digits}f}{suffix} "
            f"| {change:+.0%} |"
        )

    def added(kind: dict[str, Sampled], name: str, q: float) -> float:
        return _delta(kind[name].load, kind["direct"].load, q)

    return [
        f"### Against the baseline (gateway at `{args.baseline}`, same run, slices taking turns)",
        "",
        "| figure | this gateway | baseline | change |",
        "| --- | ---: | ---: | ---: |",
        row(
            "requests/s, plain",
            m.saturation["gateway"].wrk.requests_per_s,
            m.saturation[BASELINE].wrk.requests_per_s,
            "",
        ),
        row(
            "requests/s, SSE",
            m.streaming["gateway"].wrk.requests_per_s,
            m.streaming[BASELINE].wrk.requests_per_s,
            "",
        ),
        row(
            "CPU per request, plain",
            _cpu_per_request_ms(m.saturation["gateway"]) * 1000,
            _cpu_per_request_ms(m.saturation[BASELINE]) * 1000,
            "µs",
        ),
        row(
            "added p50, one connection",
            added(m.latency, "gateway", 50) * 1000,
            added(m.latency, BASELINE, 50) * 1000,
            "µs",
        ),
        row(
            f"added p99, open loop {args.rate:g}/s",
            added(m.open_loop, "gateway", 99),
            added(m.open_loop, BASELINE, 99),
            "ms",
            2,
        ),
        "",
    ]


def _targets(m: Measurements, *, upstream: str, nproc: int) -> list[str]:
    gateway_rps = m.saturation["gateway"].wrk.requests_per_s
    admitted = m.saturation["gateway"].valkey_commands_per_request >= ADMISSION_CALLS_PER_REQUEST
    added_p50 = _delta(m.latency["gateway"].load, m.latency["direct"].load, 50)
    added_open_p99 = _delta(m.open_loop["gateway"].load, m.open_loop["direct"].load, 99)
    errors = total_errors(m)

    def verdict(ok: bool) -> str:
        return "met" if ok else "**not met**"

    rps_verdict = verdict(gateway_rps >= TARGET_RPS)
    if not admitted:
        rps_verdict += (
            " (without admission: the gateway made no Valkey call per request, so this"
            " is authentication + relay only)"
        )
    relay_rps = m.saturation["relay-aiohttp"].wrk.requests_per_s
    share = gateway_rps / relay_rps if relay_rps else 0.0
    own_client_rps = m.saturation["relay-switchyard"].wrk.requests_per_s
    own_client_share = gateway_rps / own_client_rps if own_client_rps else 0.0
    return [
        "| target | measured | |",
        "| --- | ---: | --- |",
        f"| ≥ {TARGET_RPS:,} admitted requests/s, one gateway process, full admission "
        f"| {gateway_rps:,.0f} | {rps_verdict} |",
        f"| ≥ {TARGET_RELAY_SHARE:.0%} of the bare aiohttp relay's requests/s (the issue's "
        f"reference; same run, same machine) | {share:.0%} ({gateway_rps:,.0f} / "
        f"{relay_rps:,.0f}) | {verdict(share >= TARGET_RELAY_SHARE and admitted)} |",
        "| (no target) share of the bare relay with the gateway's own client "
        f"| {own_client_share:.0%} ({gateway_rps:,.0f} / {own_client_rps:,.0f}) | — |",
        f"| added p50 ≤ {TARGET_ADDED_P50_MS} ms at one connection | {_ms(added_p50)} "
        f"| {verdict(added_p50 <= TARGET_ADDED_P50_MS)} |",
        f"| added p99 ≤ {TARGET_ADDED_OPEN_P99_MS:g} ms at 500 requests/s, open loop "
        f"| {_ms(added_open_p99)} | {verdict(added_open_p99 <= TARGET_ADDED_OPEN_P99_MS)} |",
        f"| zero errors (all runs, all paths) | {errors} | {verdict(errors == 0)} |",
        "",
        _machine_speed(m, upstream=upstream, nproc=nproc),
    ]


def _machine_speed(m: Measurements, *, upstream: str, nproc: int) -> str:
    """How this machine compares with the one the absolute targets were set on, measured by
    the same yardstick: the bare aiohttp relay's CPU per request."""
    relay_ms = _cpu_per_request_ms(m.saturation["relay-aiohttp"])
    own_client_ms = _cpu_per_request_ms(m.saturation["relay-switchyard"])
    gateway_ms = _cpu_per_request_ms(m.saturation["gateway"])
    direct_ms = _cpu_per_request_ms(m.saturation["direct"])
    factor = relay_ms / REFERENCE_RELAY_CPU_MS
    replicas = (
        "the fake vLLM replicas" if upstream == "instant" else "the simulator replicas"
    ) + f" ({direct_ms:.3f} ms of CPU a request, answered directly)"
    return (
        f"The absolute targets were set on a machine where the bare aiohttp relay costs "
        f"{REFERENCE_RELAY_CPU_MS} ms of CPU a request, against a fake vLLM that answers at "
        f"once; here it costs {relay_ms:.3f} ms ({factor:.1f}× as much), and {replicas} and "
        f"the load generator share the same {nproc} cores. The relay with the gateway's own "
        f"client costs {own_client_ms:.3f} ms. The gateway costs {gateway_ms:.3f} ms a request "
        f"here, {gateway_ms / own_client_ms if own_client_ms else 0:.1f}× that relay: its own "
        f"work on top of the same HTTP stack and upstream client is "
        f"{gateway_ms - own_client_ms:.3f} ms of CPU a request."
    )


def _cpu_per_request_ms(run: Saturation) -> float:
    """The serving process's CPU time per request answered."""
    return 1000 * run.cpu.by_process[run.serving_process] / max(1, run.wrk.ok_requests)


def _generator_note(m: Measurements, nproc: int) -> str:
    runs = [*m.saturation.values(), *m.streaming.values()]
    sampled = [*m.latency.values(), *m.open_loop.values()]
    wrk_peak = max(run.cpu.cores("load generator") for run in runs)
    client_peak = max(run.cpu.cores("load generator") for run in sampled)
    lag_p99 = max(percentile(run.load.send_lag_ms, 99) for run in m.open_loop.values())
    wrk_limited = [
        f"{LABELS[name]} ({scenario})"
        for scenario, group in (("plain", m.saturation), ("SSE", m.streaming))
        for name, run in group.items()
        if run.cpu.cores("load generator") >= SATURATED_CORE
    ]
    other_peak = max(
        [run.cpu.other_cores for run in runs] + [run.cpu.other_cores for run in sampled]
    )
    note = [
        f"Load generator: wrk's one thread used at most {wrk_peak:.2f} of a core and "
        f"`loadgen.py` at most {client_peak:.2f}; in the open loop it woke up for its "
        f"requests at most {_ms(lag_p99)} late at p99 (its own timing error, counted in "
        "every path's figures alike)."
    ]
    if wrk_limited:
        note.append(
            f"**wrk was the limit** (≥ {SATURATED_CORE:.0%} of its thread) for: "
            + ", ".join(wrk_limited)
            + "; those requests/s are the generator's, not the server's."
        )
    else:
        note.append(
            "Neither was the limit of any run. With "
            f'{nproc} cores shared by every process, the "limit" column says what ran out '
            "instead: the serving process's one core, or the whole machine."
        )
    if other_peak > BUSY_MACHINE_CORES:
        note.append(
            f"**Other work was running** on the machine (up to {other_peak:.2f} cores, "
            '"other" columns): absolute figures are pessimistic; the paths took turns, so '
            "the comparison between them holds better."
        )
    return " ".join(note)


def _references(m: Measurements, *, upstream: str) -> str:
    def relay(name: str) -> str:
        rps = m.saturation[name].wrk.requests_per_s
        added = _delta(m.latency[name].load, m.latency["direct"].load, 50)
        return f"{rps:,.0f} requests/s, adding {_ms(added)} at p50"

    replicas = (
        "the fake vLLM"
        if upstream == "instant"
        else f"the simulator (about {SIMULATOR_CPU_MS} ms of CPU a request)"
    )
    return (
        "Reference points, measured on this machine kind: LiteLLM Proxy about 126 requests/s "
        "per worker, adding about 9 ms; a bare aiohttp relay about 8,000 requests/s per "
        "process against a fake vLLM that answers at once, adding about 0.2 ms. This run's "
        f"aiohttp relay: {relay('relay-aiohttp')}; with the gateway's own client: "
        f"{relay('relay-switchyard')}; both with {replicas} and the load generator on the "
        "same cores."
    )


def _cpu_by_process(run: Saturation) -> str:
    answered = max(1, run.wrk.ok_requests)
    shares = sorted(run.cpu.by_process.items(), key=lambda item: -item[1])
    # Every process, idle ones too: a replica at 0.000 ms is one the scheduler sent nothing.
    return ", ".join(f"{name} {1000 * seconds / answered:.3f} ms" for name, seconds in shares)


def _limit(run: Saturation, nproc: int) -> str:
    if run.cpu.cores("load generator") >= SATURATED_CORE:
        return "wrk"
    if run.cpu.cores(run.serving_process) >= SATURATED_CORE:
        return f"{run.serving_process}'s core"
    if run.cpu.machine_cores >= SATURATED_CORE * nproc:
        return "all cores"
    return "—"


def total_errors(m: Measurements) -> int:
    closed = [*m.saturation.values(), *m.streaming.values()]
    sampled = [*m.latency.values(), *m.open_loop.values()]
    return sum(run.wrk.errors for run in closed) + sum(run.load.errors for run in sampled)


def _delta(result: LoadResult, base: LoadResult, q: float) -> float:
    return result.percentile(q) - base.percentile(q)


def _added(result: LoadResult, base: LoadResult, q: float, name: str) -> str:
    if name == "direct":
        return "—"
    delta = _delta(result, base, q)
    return ("+" if delta >= 0 else "−") + _ms(abs(delta))


def _ms(value: float) -> str:
    return f"{value:.2f} ms" if abs(value) >= 1 else f"{value * 1000:.0f} µs"


def replace_section(path: Path, section: str, title: str = "Gateway") -> None:
    """Replace the ``## <title>`` section (up to the next ``## ``), or append it."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1).rstrip("\n") + "\n"
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)
