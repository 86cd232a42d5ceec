"""Closed-loop load with wrk (Debian's 4.1): POST bodies through a Lua script, parsed results.

wrk's latency histogram has microsecond resolution, fine enough for the sub-millisecond
differences measured here. Its own CPU time is read from the kernel's account of reaped
children, to tell when the load generator, not the server, was the limit.
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WrkResult:
    requests: int
    duration_s: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_s: float  # wrk's own user + system time

    @property
    def ok_requests(self) -> int:
        return max(0, self.requests - self.errors)


def write_script(
    path: Path, body: dict[str, object] | list[dict[str, object]], headers: dict[str, str]
) -> Path:
    lines = ['wrk.method = "POST"']
    lines += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()]
    lines.append(f"wrk.body = {json.dumps(json.dumps(body))}")
    path.write_text("\n".join(lines) + "\n")
    return path


def run_wrk(
    url: str, script: Path, *, connections: int, duration_s: float, threads: int = 1
) -> WrkResult:
    seconds = max(1, round(duration_s))  # wrk takes whole seconds only
    command = [
        "wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s",
        "--latency", "--timeout", "5s", "-s", str(script), url,
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(command, capture_output=True, text=True, check=False, timeout=seconds + 30)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{out.stdout}{out.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return parse(out.stdout, cpu)


def parse(text: str, cpu_s: float) -> WrkResult:
    count = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)\b", text)
    if count is None:
        raise RuntimeError(f"unexpected wrk output:\n{text}")
    duration_s = _to_ms(count.group(2) + count.group(3)) / 1000
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    socket_errors = re.search(r"Socket errors: (.*)", text)
    errors = int(non_2xx.group(1)) if non_2xx else 0
    if socket_errors:
        errors += sum(int(n) for n in re.findall(r"\d+", socket_errors.group(1)))
    return WrkResult(
        requests=int(count.group(1)),
        duration_s=duration_s,
        requests_per_s=float(_search(r"Requests/sec:\s+([\d.]+)", text)),
        p50_ms=_to_ms(_search(r"\s50%\s+(\S+)", text)),
        p99_ms=_to_ms(_search(r"\s99%\s+(\S+)", text)),
        errors=errors,
        cpu_s=cpu_s,
    )


def _search(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    if match is None:
        raise RuntimeError(f"unexpected wrk output (no {pattern!r}):\n{text}")
    return match.group(1)


def _to_ms(value: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", value)
    if match is None:
        raise RuntimeError(f"unexpected wrk duration {value!r}")
    number, unit = match.groups()
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


def merge(results: list[WrkResult]) -> WrkResult:
    """Slices of one measurement: totals add up; p50 and p99 are the slices' means."""
    requests = sum(r.requests for r in results)
    duration_s = sum(r.duration_s for r in results)
    return WrkResult(
        requests=requests,
        duration_s=duration_s,
        requests_per_s=requests / duration_s if duration_s else 0.0,
        p50_ms=sum(r.p50_ms for r in results) / len(results),
        p99_ms=sum(r.p99_ms for r in results) / len(results),
        errors=sum(r.errors for r in results),
        cpu_s=sum(r.cpu_s for r in results),
    )
