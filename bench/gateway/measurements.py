"""What the overhead benchmark measures, per path: the shapes its runs produce and its report
reads (bench/gateway/overhead.py measures, bench/gateway/report.py writes them out)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .loadgen import LoadResult
from .machine import CpuUsage
from .wrk import WrkResult


@dataclass(frozen=True)
class Saturation:
    target: str
    serving_process: str
    wrk: WrkResult
    cpu: CpuUsage
    valkey_commands: int  # that Valkey ran meanwhile

    @property
    def valkey_commands_per_request(self) -> float:
        return self.valkey_commands / max(1, self.wrk.requests)


@dataclass(frozen=True)
class Sampled:
    target: str
    load: LoadResult
    cpu: CpuUsage


@dataclass
class Measurements:
    latency: dict[str, Sampled] = field(default_factory=dict)
    saturation: dict[str, Saturation] = field(default_factory=dict)
    streaming: dict[str, Saturation] = field(default_factory=dict)
    open_loop: dict[str, Sampled] = field(default_factory=dict)
