"""How many requests a second one simulator process answers, and how fast.

    .venv/bin/python -m bench.simulator.throughput [--duration 10] [--connections 32]

Starts ``python -m simulator --time-scale 0`` on loopback and drives it with wrk
(Debian: ``apt-get install -y wrk``), a C load generator that stays far from being the
bottleneck, for short non-streaming chat completions and for short streams. Prints a
Markdown table for bench/RESULTS.md, with the machine it ran on. Bounded: every run stops
after ``--duration`` seconds, and the simulator is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

MODEL = "bench-chat"
MESSAGES = [{"role": "user", "content": "Give me a one-word answer: what colour is the sky?"}]
SCENARIOS = {
    "chat, non-streaming, max_tokens 4": {"messages": MESSAGES, "max_tokens": 4},
    "chat, streaming (SSE), max_tokens 4": {
        "messages": MESSAGES,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
}


@dataclass
class Result:
    name: str
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    sim_cpu_percent: float


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_simulator(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator", "--port", str(port),
         "--served-model-name", MODEL, "--time-scale", "0", "--max-num-seqs", "1024"],
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the simulator did not come up within 20 s")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk_script(body: dict[str, object], directory: Path) -> Path:
    path = directory / f"post-{abs(hash(json.dumps(body)))}.lua"
    path.write_text(
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = {json.dumps(json.dumps(body))}\n"
    )
    return path


def to_ms(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", value).groups()
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def run_wrk(name: str, url: str, script: Path, pid: int, args: argparse.Namespace) -> Result:
    command = [
        "wrk", "-t", str(args.threads), "-c", str(args.connections), "-d", f"{args.duration}s",
        "--latency", "-s", str(script), url,
    ]  # fmt: skip
    cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
    out = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=args.duration + 30
    )
    cpu_percent = 100 * (cpu_seconds(pid) - cpu_before) / (time.monotonic() - wall_before)
    text = out.stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
    p50 = to_ms(re.search(r"\s50%\s+(\S+)", text).group(1))
    p99 = to_ms(re.search(r"\s99%\s+(\S+)", text).group(1))
    errors_match = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    socket_errors = re.search(r"Socket errors: (.*)", text)
    errors = int(errors_match.group(1)) if errors_match else 0
    if socket_errors:
        errors += sum(int(n) for n in re.findall(r"\d+", socket_errors.group(1)))
    return Result(name, rps, p50, p99, errors, cpu_percent)


def machine() -> str:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor() or "unknown",
    )  # fmt: skip
    return f"{os.cpu_count()} CPUs (nproc), {cpu}, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per scenario")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of warm-up per scenario")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="wrk threads")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")

    port = free_port()
    sim = start_simulator(port)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, body in SCENARIOS.items():
                script = wrk_script({"model": MODEL, **body}, Path(tmp))
                warm = argparse.Namespace(**{**vars(args), "duration": args.warmup})
                run_wrk(name, url, script, sim.pid, warm)
                results.append(run_wrk(name, url, script, sim.pid, args))
    finally:
        os.killpg(sim.pid, signal.SIGTERM)
        sim.wait(10)

    print(f"machine: {machine()}")
    print(
        f"load: wrk -t{args.threads} -c{args.connections}, {args.duration} s per scenario "
        f"after {args.warmup} s of warm-up; simulator --time-scale 0, one process\n"
    )
    print("| scenario | requests/s | p50 | p99 | errors | simulator CPU |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r.name} | {r.requests_per_s:,.0f} | {r.p50_ms:.2f} ms | {r.p99_ms:.2f} ms "
            f"| {r.errors} | {r.sim_cpu_percent:.0f}% |"
        )
    if any(r.errors for r in results):
        raise SystemExit("some requests failed")


if __name__ == "__main__":
    main()
