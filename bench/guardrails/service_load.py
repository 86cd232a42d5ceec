"""The guardrail service under an open-loop load of checks, with micro-batching off and on.

    .venv/bin/python -m bench.guardrails.service_load [--rates 50,100,200] [--seconds 15]
        [--window-ms 5] [--workers 2] [--write FILE]

Starts, on loopback, the real guardrail service (``python -m guardrails.service``, the real
detectors, ``--workers`` processes) twice: with ``SWITCHYARD_GUARDRAIL_BATCH_WINDOW_MS=0``
(off: one job per request) and with ``--window-ms`` (on). Each is sent, at each rate, an open
loop of check requests for ``--seconds`` (after ``--warmup``): request ``i`` is due at
``start + i / rate`` whatever the answers do, and its latency counts from that due time. A
request is the demo's request-stage guardrails (ops/demo.py: secrets block, invisible text
and PII redact, prompt injection flag; banned topics runs on the fleet, not here) on a prompt
of about 1 KB joined from the evaluation set's prompts (tests/guardrails/eval/prompts.jsonl),
a different one each request in turn. ``--checks cheap``: the two rule-based ones only.

Reports, per mode and rate, the checks answered 200 per second of the window, p50 and p99 of
those, the errors by status (503 busy, 504 timeout, other, unanswered) and the mean requests
per worker job (from the service's batch-size histogram) as a markdown table; ``--write``
also writes it to a file. Bounded: every request has a 10 s client timeout, answers still
outstanding 10 s after the window closes are counted unanswered, and every process is
stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import math
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx
import orjson

from bench.gateway.machine import describe
from guardrails.catalogue import validate_selection
from testkit.guardrail_quality import load_prompts
from testkit.stack import RunningGuardrailService, running_stack

# ops/demo.py's request-stage selections that run in guardrail workers.
DEMO_REQUEST = (
    ("secrets", "block"),
    ("invisible_text", "redact"),
    ("pii", "redact"),
    ("prompt_injection", "flag"),
)
# Its rule-based ones only (about a millisecond a check): where the service's own overhead
# per request, which batching saves, is a large part of a check.
CHEAP_REQUEST = DEMO_REQUEST[:2]
CHECKS = {"demo": DEMO_REQUEST, "cheap": CHEAP_REQUEST}
PROMPT_BYTES = 1024
PROMPTS = 64
CLIENT_TIMEOUT_S = 10.0
DRAIN_S = 10.0


def prompts(size: int = PROMPT_BYTES, count: int = PROMPTS) -> list[str]:
    """``count`` prompts of at most ``size`` UTF-8 bytes, each the evaluation set's prompts
    joined from a different starting point (benign and injection as they come)."""
    pool = [p["text"] for p in load_prompts()]
    step = max(1, len(pool) // count)
    out = []
    for n in range(count):
        at, used = n * step, 0
        parts: list[str] = []
        while True:
            text = pool[at % len(pool)]
            cost = len(text.encode()) + (1 if parts else 0)
            if used + cost > size:
                break
            parts.append(text)
            used += cost
            at += 1
        out.append("\n".join(parts))
    return out


def bodies(selections: tuple[tuple[str, str], ...] = DEMO_REQUEST) -> list[bytes]:
    checks = [
        {
            "guardrail": name,
            "action": action,
            "settings": validate_selection(name, "request", action, {}),
        }
        for name, action in selections
    ]
    return [
        orjson.dumps({"stage": "request", "texts": [text], "checks": checks}) for text in prompts()
    ]


@dataclass
class Result:
    mode: str
    rate: float
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)  # answered 200, sorted
    errors: Counter[str] = field(default_factory=Counter)
    jobs: float = 0.0
    requests: float = 0.0

    @property
    def achieved(self) -> float:
        return len(self.latencies_ms) / self.seconds

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return math.nan
        rank = max(1, math.ceil(q / 100 * len(self.latencies_ms)))
        return self.latencies_ms[min(rank, len(self.latencies_ms)) - 1]


async def open_loop(url: str, payloads: list[bytes], rate: float, seconds: float, warmup: float,
                    result: Result) -> None:  # fmt: skip
    """Request ``i`` due at ``start + i / rate``; only those due after the warm-up recorded."""
    loop = asyncio.get_running_loop()
    connector = aiohttp.TCPConnector(limit=512)
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = loop.time() + 0.1
        record_from = start + warmup

        async def one(i: int, due: float) -> None:
            await asyncio.sleep(max(0.0, due - loop.time()))
            try:
                async with session.post(
                    url + "/v1/check",
                    data=payloads[i % len(payloads)],
                    headers={"Content-Type": "application/json"},
                ) as response:
                    await response.read()
                    status = response.status
            except (TimeoutError, aiohttp.ClientError):
                status = 0
            if due < record_from:
                return
            if status == 200:
                result.latencies_ms.append((loop.time() - due) * 1000)
            else:
                result.errors[{0: "unanswered", 503: "503", 504: "504"}.get(status, "other")] += 1

        total = round(rate * (warmup + seconds))
        tasks = [asyncio.create_task(one(i, start + i / rate)) for i in range(total)]
        _done, pending = await asyncio.wait(tasks, timeout=warmup + seconds + 0.1 + DRAIN_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        result.errors["unanswered"] += sum(
            1 for i, task in enumerate(tasks) if task in pending and start + i / rate >= record_from
        )
    result.latencies_ms.sort()


def batches(url: str) -> tuple[float, float]:
    """(jobs sent to workers, requests in them) so far."""
    count = total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("switchyard_guardrail_service_batch_size_count"):
            count = float(line.rsplit(" ", 1)[1])
        elif line.startswith("switchyard_guardrail_service_batch_size_sum"):
            total = float(line.rsplit(" ", 1)[1])
    return count, total


@contextlib.contextmanager
def service(workers: int, window_ms: float, max_batch: int) -> Iterator[RunningGuardrailService]:
    with running_stack() as stack:
        yield stack.guardrail_service(
            {
                "SWITCHYARD_GUARDRAIL_WORKERS": str(workers),
                "SWITCHYARD_GUARDRAIL_BATCH_WINDOW_MS": str(window_ms),
                "SWITCHYARD_GUARDRAIL_BATCH_MAX": str(max_batch),
            },
            name=f"guardrails-window-{window_ms:g}",
            timeout=300,
        )


def measure(args: argparse.Namespace) -> list[Result]:
    payloads = bodies(CHECKS[args.checks])
    results = []
    for mode, window in (("off", 0.0), (f"on ({args.window_ms:g} ms)", args.window_ms)):
        with service(args.workers, window, args.max_batch) as running:
            # One check of each detector before measuring (first-call costs).
            for payload in payloads[:4]:
                httpx.post(running.url + "/v1/check", content=payload, timeout=60)
            for rate in args.rates:
                print(f"[{time.strftime('%H:%M:%S')}] batching {mode}, {rate:g}/s", flush=True)
                result = Result(mode, rate, args.seconds)
                jobs0, requests0 = batches(running.url)
                asyncio.run(
                    open_loop(running.url, payloads, rate, args.seconds, args.warmup, result)
                )
                jobs1, requests1 = batches(running.url)
                result.jobs, result.requests = jobs1 - jobs0, requests1 - requests0
                results.append(result)
                time.sleep(1)  # let the queue drain between rates
    return results


def render(results: list[Result], args: argparse.Namespace, started: datetime.datetime) -> str:
    machine = describe()
    lines = [
        "### Guardrail service under load: micro-batching off and on",
        "",
        f"{args.workers} workers, "
        + (
            "the demo's request guardrails (secrets, invisible text, PII, prompt injection)"
            if args.checks == "demo"
            else "the demo's rule-based request guardrails (secrets, invisible text)"
        ),
        "on ~1 KB prompts from the evaluation set; open loop, latency from",
        f"each request's due time; {args.seconds:g} s per row after {args.warmup:g} s of "
        f"warm-up. Machine: {machine['nproc']} CPUs, {machine['cpu']}; the load generator",
        f"shares them. Commit {machine['commit']}, {started:%Y-%m-%d %H:%M} UTC. Reproduce:",
        "`.venv/bin/python -m bench.guardrails.service_load`.",
        "",
        "| batching | offered/s | achieved/s | p50 | p99 | 503 busy | 504 timeout | other "
        "| unanswered | requests/job |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        per_job = f"{r.requests / r.jobs:.1f}" if r.jobs else "—"
        lines.append(
            f"| {r.mode} | {r.rate:g} | {r.achieved:.1f} | {_ms(r.percentile(50))} "
            f"| {_ms(r.percentile(99))} | {r.errors['503']} | {r.errors['504']} "
            f"| {r.errors['other']} | {r.errors['unanswered']} | {per_job} |"
        )
    return "\n".join(lines) + "\n"


def _ms(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:,.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rates", default="50,100,200", help="checks/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=15, help="measured, per rate")
    parser.add_argument("--warmup", type=float, default=2, help="seconds before each window")
    parser.add_argument("--window-ms", type=float, default=5, help="batch window when on")
    parser.add_argument("--max-batch", type=int, default=8, help="SWITCHYARD_GUARDRAIL_BATCH_MAX")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--checks", choices=sorted(CHECKS), default="demo", help="demo: all four; cheap: rules"
    )
    parser.add_argument("--write", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    args.rates = [float(rate) for rate in args.rates.split(",") if rate]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    started = datetime.datetime.now(datetime.UTC)
    table = render(measure(args), args, started)
    print(table)
    if args.write is not None:
        args.write.write_text(table, encoding="utf-8")


if __name__ == "__main__":
    main()
