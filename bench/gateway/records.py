"""What capturing full records costs the gateway: one gateway, two use cases — one keeping
``full`` records, one ``none`` — measured in the same run, slices taking turns.

    .venv/bin/python -m bench.gateway.records [--no-write] [--seconds 10] [--rounds 5]

Starts the overhead benchmark's stack (bench/gateway/stack.py: Valkey, two instant fake vLLM
replicas, a fleet watcher, one gateway as testkit/stack.py starts it) with answers of
``--answer-bytes`` (1 KB) of text, and publishes two keys on one model: use case "full"
(record policy full: every request's body and answer go to ``sy:records``) and use case
"none". Each request sends ``--request-bytes`` (1 KB) of prompt. Then, per policy:

- throughput at saturation: wrk -c64 (Debian's wrk), or, where wrk is not installed, the
  closed-loop load generator (bench/gateway/loadgen.py) on as many connections — the table
  says which; with the gateway's CPU per request;
- latency at one connection (closed loop, every sample kept): p50 and p99.

The ratio of full's throughput to none's is the figure the issue targets (at least 0.90:
no more than 10 % lower), and full's p50/p99 minus none's the latency capture adds. No
persister runs, so the streams are trimmed between slices (untimed); a transcript the
gateway had to drop for want of buffer is counted from its metrics and reported.

Prints a Markdown section and replaces "Records — capture overhead" in bench/RESULTS.md
(``--no-write`` leaves it alone).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import http.client
import re
import secrets
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import orjson

from gateway.accounting import RECORDS_STREAM, USAGE_STREAM
from gateway.policy import SCHEMA, KeyEntry, RecordPolicy, SnapshotDocument, snapshot_write

from . import report
from .loadgen import LoadResult, merge, run_load
from .machine import CpuMeter, CpuUsage, describe, merge_usage, wait_for_quiet
from .overhead import _stop_on_sigterm, log
from .stack import GENEROUS_LIMITS, MODEL, Stack, running_stack
from .wrk import WrkResult, run_wrk, write_script

TITLE = "Records — capture overhead"
CHAT_PATH = "/v1/chat/completions"
POLICIES: tuple[RecordPolicy, ...] = ("none", "full")
RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"
TARGET_RATIO = 0.90


def chat_body(request_bytes: int) -> bytes:
    """A chat completion whose JSON body is ``request_bytes`` long (give or take a byte)."""
    shell = orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": ""}], "max_tokens": 4}
    )
    text = ("Why is the sky blue? " * (request_bytes // 21 + 1))[
        : max(0, request_bytes - len(shell))
    ]
    return orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    )


def publish_record_policies(stack: Stack) -> dict[str, str]:
    """One key per record policy, each its own use case on the stack's model (version 2 of
    the snapshot, after the stack's own); returns policy → key plaintext."""
    keys: dict[str, KeyEntry] = {}
    plaintexts: dict[str, str] = {}
    use_cases = {}
    for use_case_id, policy in enumerate(POLICIES, start=10):
        plaintext = "sk-sy-" + secrets.token_urlsafe(32)
        plaintexts[policy] = plaintext
        keys[hashlib.sha256(plaintext.encode()).hexdigest()] = {
            "key_id": use_case_id,
            "prefix": plaintext[:12],
            "tenant": "bench",
            "tenant_id": 1,
            "environment": "prod",
            "use_case": f"records-{policy}",
            "use_case_id": use_case_id,
            "namespace": "prod",
            "models": [MODEL],
            "expires_at": None,
        }
        use_cases[str(use_case_id)] = {
            "tenant": "bench",
            "slug": f"records-{policy}",
            "limits": GENEROUS_LIMITS,
            "guardrails": [],
            "record": policy,
        }
    document: SnapshotDocument = {
        "schema": SCHEMA,
        "version": 2,
        "published_at": time.time(),
        "models": {
            MODEL: {
                "served_name": MODEL,
                "capabilities": ["chat", "completions"],
                "replicas": list(stack.replica_urls),
                "timeout_s": 30.0,
                "max_tokens": None,
                "max_in_flight_per_replica": 1024,
            }
        },
        "keys": keys,
        "use_cases": use_cases,  # type: ignore[typeddict-item]
    }
    snapshot_write(stack.valkey, document)
    deadline = time.monotonic() + 10
    while _policy_version(stack.gateway_port) != 2:
        if time.monotonic() > deadline:
            raise SystemExit("the gateway did not load the records policy within 10 s")
        time.sleep(0.1)
    return plaintexts


def _policy_version(port: int) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/healthz")
        return int(orjson.loads(connection.getresponse().read())["policy_version"])
    finally:
        connection.close()


def _gateway_metric(port: int, name: str) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    total = 0.0
    for match in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE):
        total += float(match.group(1))
    return total


@dataclass(frozen=True)
class Throughput:
    requests: int
    errors: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    cpu: CpuUsage

    @property
    def gateway_us_per_request(self) -> float:
        return self.cpu.by_process.get("gateway", 0.0) / max(1, self.requests) * 1e6


@dataclass(frozen=True)
class Latency:
    load: LoadResult
    cpu: CpuUsage


@dataclass
class Results:
    tool: str
    throughput: dict[str, list[Throughput]]
    latency: dict[str, list[Latency]]
    records_written: int
    content_dropped: float


class RecordsBench:
    def __init__(self, stack: Stack, args: argparse.Namespace, tmp: Path) -> None:
        self.stack = stack
        self.args = args
        self.body = chat_body(args.request_bytes)
        self.keys = publish_record_policies(stack)
        self.headers = {
            policy: {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
            for policy, key in self.keys.items()
        }
        self.use_wrk = shutil.which("wrk") is not None and not args.no_wrk
        self.scripts = {
            policy: write_script(tmp / f"{policy}.lua", orjson.loads(self.body), headers)
            for policy, headers in self.headers.items()
        }
        self.records_written = 0

    def run(self) -> Results:
        self.check()
        tool = f"wrk -c{self.args.connections}" if self.use_wrk else "loadgen"
        throughput: dict[str, list[Throughput]] = {policy: [] for policy in POLICIES}
        latency: dict[str, list[Latency]] = {policy: [] for policy in POLICIES}
        log(f"saturation ({tool}), {self.args.rounds} rounds")
        for _ in range(self.args.rounds):
            for policy in POLICIES:
                self._quiet()
                throughput[policy].append(self._saturate(policy))
        log(f"latency at one connection, {self.args.rounds} rounds")
        for _ in range(self.args.rounds):
            for policy in POLICIES:
                self._quiet()
                latency[policy].append(self._one_connection(policy))
        dropped = _gateway_metric(
            self.stack.gateway_port, "switchyard_gateway_records_content_dropped_total"
        )
        self._trim()
        return Results(tool, throughput, latency, self.records_written, dropped)

    def check(self) -> None:
        """Each policy answers 200, and only full writes a transcript."""
        for policy in POLICIES:
            self._trim()
            connection = http.client.HTTPConnection("127.0.0.1", self.stack.gateway_port)
            try:
                connection.request("POST", CHAT_PATH, self.body, self.headers[policy])
                response = connection.getresponse()
                answer = response.read()
            finally:
                connection.close()
            if response.status != 200:
                raise SystemExit(f"{policy}: {response.status} {answer[:300]!r}")
            deadline = time.monotonic() + 5
            while not self.stack.valkey.xlen(USAGE_STREAM) and time.monotonic() < deadline:
                time.sleep(0.05)
            kept = self._length(RECORDS_STREAM)
            if kept != (1 if policy == "full" else 0):
                raise SystemExit(f"{policy}: {kept} transcripts written, not as the policy says")
            log(f"{policy}: {len(self.body)} bytes in, {len(answer)} bytes out")
        self._trim()

    def _length(self, stream: str) -> int:
        return int(cast(int, self.stack.valkey.xlen(stream)))

    def _quiet(self) -> None:
        wait_for_quiet(
            self.stack.pids, max_wait_s=self.args.settle, threshold_cores=self.args.quiet_cores
        )

    def _trim(self) -> None:
        """No persister runs: empty the streams between slices (untimed), counting records."""
        self.records_written += self._length(RECORDS_STREAM)
        for stream in (USAGE_STREAM, RECORDS_STREAM):
            self.stack.valkey.xtrim(stream, maxlen=0)

    def _slice_s(self, total_s: float) -> float:
        return float(total_s) / int(self.args.rounds)

    def _saturate(self, policy: str) -> Throughput:
        duration = self._slice_s(self.args.seconds)
        port = self.stack.gateway_port
        if self.use_wrk:
            url = f"http://127.0.0.1:{port}{CHAT_PATH}"
            script = self.scripts[policy]
            run_wrk(url, script, connections=self.args.connections, duration_s=self.args.warmup)
            meter = CpuMeter(self.stack.pids)
            result: WrkResult = run_wrk(
                url, script, connections=self.args.connections, duration_s=duration
            )
            cpu = meter.stop(extra={"load generator": result.cpu_s})
            self._trim()
            return Throughput(
                result.requests,
                result.errors,
                result.requests_per_s,
                result.p50_ms,
                result.p99_ms,
                cpu,
            )
        meter = CpuMeter(self.stack.pids)
        load = run_load(
            host="127.0.0.1",
            port=port,
            path=CHAT_PATH,
            body=self.body,
            headers=self.headers[policy],
            duration_s=duration,
            warmup_s=self.args.warmup,
            connections=self.args.connections,
        )
        cpu = meter.stop(extra={"load generator": load.client_cpu_s})
        self._trim()
        return Throughput(
            load.completed,
            load.errors,
            load.requests_per_s,
            load.percentile(50),
            load.percentile(99),
            cpu,
        )

    def _one_connection(self, policy: str) -> Latency:
        meter = CpuMeter(self.stack.pids)
        load = run_load(
            host="127.0.0.1",
            port=self.stack.gateway_port,
            path=CHAT_PATH,
            body=self.body,
            headers=self.headers[policy],
            duration_s=self._slice_s(self.args.latency_seconds),
            warmup_s=self.args.warmup,
        )
        cpu = meter.stop(extra={"load generator": load.client_cpu_s})
        self._trim()
        return Latency(load, cpu)


def _throughput(slices: list[Throughput]) -> Throughput:
    requests = sum(s.requests for s in slices)
    cpu = merge_usage([s.cpu for s in slices])
    return Throughput(
        requests,
        sum(s.errors for s in slices),
        requests / max(cpu.wall_s, 1e-9),
        # Slices keep percentiles only: the median slice's p50, the worst slice's p99.
        sorted(s.p50_ms for s in slices)[len(slices) // 2],
        max(s.p99_ms for s in slices),
        cpu,
    )


def render(results: Results, *, machine: dict[str, str], args: argparse.Namespace) -> str:
    through = {policy: _throughput(results.throughput[policy]) for policy in POLICIES}
    latency = {policy: merge([one.load for one in results.latency[policy]]) for policy in POLICIES}
    ratio = through["full"].requests_per_s / max(through["none"].requests_per_s, 1e-9)
    verdict = "meets" if ratio >= TARGET_RATIO else "misses"
    stamp = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}"
    lines = [
        f"## {TITLE}",
        "",
        " ".join(
            [
                f"`python -m bench.gateway.records` — {stamp} UTC,",
                f"{machine.get('nproc', '?')} × {machine.get('cpu', '?')},",
                f"commit {machine.get('commit', '?')}.",
                "One gateway, two use cases on the same instant replicas,",
                f"slices taking turns ({args.rounds} rounds): record policy `full` against",
                f"`none`, {args.request_bytes} B of request body and {args.answer_bytes} B of",
                f"answer text per chat completion. Saturation with {results.tool}.",
            ]
        ),
        "",
        "| record policy | req/s at saturation | gateway CPU µs/req | p50 ms (c1) "
        "| p99 ms (c1) | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for policy in POLICIES:
        t, lat = through[policy], latency[policy]
        lines.append(
            f"| `{policy}` | {t.requests_per_s:,.0f} | {t.gateway_us_per_request:.0f} | "
            f"{lat.percentile(50):.3f} | {lat.percentile(99):.3f} | {t.errors + lat.errors} |"
        )
    added50 = latency["full"].percentile(50) - latency["none"].percentile(50)
    added99 = latency["full"].percentile(99) - latency["none"].percentile(99)
    lines += [
        "",
        f"Throughput with `full` is **{ratio:.1%}** of `none` ({verdict} the target of at "
        f"least {TARGET_RATIO:.0%}); capture adds {added50 * 1000:+.0f} µs at p50 and "
        f"{added99 * 1000:+.0f} µs at p99 at one connection. {results.records_written:,} "
        f"transcripts reached `sy:records`; {results.content_dropped:,.0f} were dropped for "
        "want of buffer.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20, help="per policy, at saturation")
    parser.add_argument("--latency-seconds", type=float, default=10, help="per policy, at -c1")
    parser.add_argument("--rounds", type=int, default=5, help="slices per measurement")
    parser.add_argument("--warmup", type=float, default=1, help="seconds before each slice")
    parser.add_argument("--connections", type=int, default=64, help="connections at saturation")
    parser.add_argument("--request-bytes", type=int, default=1024, help="request body size")
    parser.add_argument("--answer-bytes", type=int, default=1024, help="answer text size")
    parser.add_argument("--settle", type=float, default=0.5, help="most seconds to wait")
    parser.add_argument("--quiet-cores", type=float, default=0.2, help="others' load: quiet")
    parser.add_argument("--no-wrk", action="store_true", help="saturate with the loadgen")
    parser.add_argument("--no-write", action="store_true", help="leave bench/RESULTS.md alone")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    machine = describe()
    log("starting valkey, two instant fake vLLMs and the gateway")
    with (
        running_stack(content_bytes=args.answer_bytes) as stack,
        tempfile.TemporaryDirectory() as tmp,
    ):
        results = RecordsBench(stack, args, Path(tmp)).run()
    log("all processes stopped")
    section = render(results, machine=machine, args=args)
    print()
    print(section)
    if not args.no_write:
        report.replace_section(RESULTS, section, title=TITLE)
        log(f"wrote the {TITLE} section of {RESULTS}")
    failed = sum(s.errors for s in results.throughput["full"] + results.throughput["none"])
    if failed:
        raise SystemExit(f"{failed} requests failed")


if __name__ == "__main__":
    main()
