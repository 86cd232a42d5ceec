"""What recording a request costs the gateway's event loop: metrics and the accounting writer.

Two figures the hot path relies on, measured here rather than asserted in tests (a timed
assertion fails on a loaded machine and proves nothing on an idle one):

- metrics: one request's recording through GatewayMetrics' cached children, against the same
  work through ``labels()`` on every call, as naive code would do it;
- accounting with Valkey down: ``record_usage`` against a port nothing listens on (the writer
  retries in the background), its mean and p99, the event loop's worst lag meanwhile and how
  long ``close`` takes; and against a hung Valkey (accepts, never answers).

``python -m bench.gateway.recording`` prints the figures and rewrites its section of
bench/RESULTS.md (``--no-write`` to only print).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time

import valkey.asyncio as avalkey
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bench.gateway.machine import describe as describe_machine
from bench.results import write_section
from gateway.accounting import Accounting
from gateway.metrics import GatewayMetrics
from ops.processes import free_port

MODEL = "llama-test"
REPLICA = "http://10.0.0.5:8000"
SECTION = "## Gateway — recording costs (metrics, accounting with Valkey down)"


def _one_request(metrics: GatewayMetrics) -> None:
    metrics.admission_decided("admitted")
    metrics.in_flight_changed(model=MODEL, replica=REPLICA, delta=1)
    metrics.request_finished(
        model=MODEL,
        status=200,
        upstream_s=0.42,
        ttft_s=0.05,
        prompt_tokens=120,
        completion_tokens=30,
    )
    metrics.in_flight_changed(model=MODEL, replica=REPLICA, delta=-1)


def metrics_costs(rounds: int) -> tuple[float, float]:
    """µs per request: cached children, then labels() on every call."""
    metrics = GatewayMetrics(process_collectors=False)
    _one_request(metrics)  # children created once, as after a model's first request
    started = time.perf_counter()
    for _ in range(rounds):
        _one_request(metrics)
    cached_us = (time.perf_counter() - started) / rounds * 1e6

    r = CollectorRegistry()
    requests = Counter("r", "", ["model", "status"], registry=r)
    decisions = Counter("d", "", ["decision", "reason"], registry=r)
    upstream = Histogram("u", "", ["model"], registry=r)
    ttft = Histogram("t", "", ["model"], registry=r)
    tokens = Counter("k", "", ["model", "kind"], registry=r)
    in_flight = Gauge("i", "", ["model", "replica"], registry=r)
    started = time.perf_counter()
    for _ in range(rounds):
        decisions.labels("admitted", "").inc()
        in_flight.labels(MODEL, REPLICA).inc(1)
        requests.labels(MODEL, "200").inc()
        upstream.labels(MODEL).observe(0.42)
        ttft.labels(MODEL).observe(0.05)
        tokens.labels(MODEL, "prompt").inc(120)
        tokens.labels(MODEL, "completion").inc(30)
        in_flight.labels(MODEL, REPLICA).inc(-1)
    naive_us = (time.perf_counter() - started) / rounds * 1e6
    return cached_us, naive_us


def _usage(accounting: Accounting, n: int) -> None:
    accounting.record_usage(
        request_id=f"req-{n}",
        tenant="acme",
        use_case_id=7,
        key_id=11,
        model=MODEL,
        replica=REPLICA,
        status=200,
        prompt_tokens=120,
        completion_tokens=30,
        queued_ms=4.4,
        upstream_ms=250.0,
        total_ms=256.6,
        policy_version=3,
        at_ms=1_700_000_000_000 + n,
    )


async def _down(calls: int) -> tuple[list[float], float, float]:
    dead = avalkey.Valkey(port=free_port(), socket_connect_timeout=0.5)  # nothing listens
    accounting = Accounting(dead, buffer_limit=1_000, flush_interval_s=0.01)
    await accounting.start()
    durations: list[float] = []
    worst_lag = 0.0
    for n in range(calls):
        started = time.perf_counter()
        _usage(accounting, n)
        durations.append(time.perf_counter() - started)
        if n % 1000 == 0:
            before = time.perf_counter()
            await asyncio.sleep(0.005)
            worst_lag = max(worst_lag, time.perf_counter() - before - 0.005)
    closing = time.perf_counter()
    await accounting.close(timeout_s=0.5)
    return durations, worst_lag, time.perf_counter() - closing


async def _hung(calls: int) -> float:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    try:
        client = avalkey.Valkey(port=sock.getsockname()[1], socket_timeout=5)
        accounting = Accounting(
            client, buffer_limit=100, flush_interval_s=0.01, write_timeout_s=0.1
        )
        await accounting.start()
        started = time.perf_counter()
        for n in range(calls):
            _usage(accounting, n)
            await asyncio.sleep(0)
        elapsed = time.perf_counter() - started
        await accounting.close(timeout_s=0.3)
        return elapsed
    finally:
        sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20_000)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    cached_us, naive_us = metrics_costs(args.rounds)
    durations, worst_lag, close_s = asyncio.run(_down(args.rounds))
    durations.sort()
    mean_us = sum(durations) / len(durations) * 1e6
    p99_us = durations[int(len(durations) * 0.99)] * 1e6
    hung_s = asyncio.run(_hung(500))
    facts = describe_machine()
    machine = (
        f"{facts['nproc']} cores, {facts['cpu']}, Python {facts['python']}, at {facts['commit']}"
    )

    text = f"""{SECTION}

`python -m bench.gateway.recording` ({args.rounds:,} requests each; {machine}).
Were tests before (timed assertions); the figures live here now.

| what | figure | expected |
| --- | ---: | --- |
| metrics per request, cached children | {cached_us:.2f} µs | a few µs |
| metrics per request, `labels()` each call | {naive_us:.2f} µs | several times the cached |
| `record_usage`, Valkey down: mean | {mean_us:.2f} µs | < 50 µs |
| `record_usage`, Valkey down: p99 | {p99_us:.2f} µs | < 200 µs |
| event loop's worst lag meanwhile | {worst_lag * 1e3:.1f} ms | < 100 ms |
| `close(timeout_s=0.5)` with Valkey down | {close_s * 1e3:.0f} ms | < 2 s |
| 500 records against a hung Valkey | {hung_s * 1e3:.0f} ms | < 200 ms |
"""
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
