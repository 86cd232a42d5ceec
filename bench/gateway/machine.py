"""What the machine is, and where its CPU went during a measurement.

On a 2-core machine the load generator, the gateway, the relays, the replicas and Valkey
share the cores with whatever else runs there, so every figure comes with the CPU each of our
processes used, the machine's total, and what the rest of the machine took ("other"):
a measurement taken while something else was busy says so.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ops.processes import REPO_ROOT

_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent not idle, all cores together."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / _TICK


@dataclass(frozen=True)
class CpuUsage:
    wall_s: float
    by_process: dict[str, float]  # CPU seconds
    machine_s: float

    def cores(self, name: str) -> float:
        return self.by_process.get(name, 0.0) / self.wall_s

    @property
    def machine_cores(self) -> float:
        return self.machine_s / self.wall_s

    @property
    def other_cores(self) -> float:
        """Cores taken by processes not ours, and by the hypervisor (steal time)."""
        return max(0.0, self.machine_s - sum(self.by_process.values())) / self.wall_s


def merge_usage(usages: list[CpuUsage]) -> CpuUsage:
    names = {name for usage in usages for name in usage.by_process}
    return CpuUsage(
        wall_s=sum(u.wall_s for u in usages),
        by_process={name: sum(u.by_process.get(name, 0.0) for u in usages) for name in names},
        machine_s=sum(u.machine_s for u in usages),
    )


class CpuMeter:
    """Reads our processes' and the machine's CPU time at start and at ``stop``."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._start_wall = time.monotonic()
        self._start = {name: process_cpu_s(pid) for name, pid in pids.items()}
        self._start_machine = machine_busy_s()

    def stop(self, extra: dict[str, float] | None = None) -> CpuUsage:
        """``extra``: CPU seconds of processes measured otherwise (the load generator)."""
        used = {name: process_cpu_s(pid) - self._start[name] for name, pid in self.pids.items()}
        used.update(extra or {})
        return CpuUsage(
            wall_s=time.monotonic() - self._start_wall,
            by_process=used,
            machine_s=machine_busy_s() - self._start_machine,
        )


def wait_for_quiet(pids: dict[str, int], *, max_wait_s: float, threshold_cores: float) -> None:
    """Wait, at most ``max_wait_s``, until processes not ours leave the cores alone."""
    deadline = time.monotonic() + max_wait_s
    while True:
        meter = CpuMeter(pids)
        time.sleep(0.25)
        if meter.stop().other_cores <= threshold_cores or time.monotonic() >= deadline:
            return


def describe() -> dict[str, str]:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor() or "unknown",
    )  # fmt: skip
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "uvicorn": importlib.metadata.version("uvicorn"),
        "uvloop": importlib.metadata.version("uvloop"),
        "httptools": importlib.metadata.version("httptools"),
        "aiohttp": importlib.metadata.version("aiohttp"),
        "wrk": _wrk_version(),
        "commit": _gateway_commit(),
    }


def _wrk_version() -> str:
    try:
        result = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
    except FileNotFoundError:  # benches that do not load the gateway need no wrk
        return "not installed"
    words = (result.stdout + result.stderr).split()
    return words[1] if len(words) > 1 else "unknown"


def _gateway_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--", "gateway"):
        commit += f" + uncommitted changes under gateway/ (digest {_tree_digest('gateway')})"
    return commit


def _tree_digest(folder: str) -> str:
    """Names what was measured when it is not a commit: a hash of the folder's sources."""
    digest = hashlib.sha256()
    root = REPO_ROOT / folder
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".lua"):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]
