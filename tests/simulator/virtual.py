"""Run the simulator's engine in virtual time: steps take no wall time, so timing is exact."""

from __future__ import annotations

import asyncio
from typing import Any

from simulator.config import SimulatorConfig
from simulator.engine import Engine, Sequence
from simulator.metrics import SimulatorMetrics

MODEL = "sim-chat"


class VirtualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep_until(self, deadline: float) -> None:
        self.t = max(self.t, deadline)


def make_engine(**settings: Any) -> Engine:
    """An engine that only steps when told to, on a virtual clock starting at 0."""
    config = SimulatorConfig(served_model_names=(MODEL,), **settings)
    return Engine(config, SimulatorMetrics(MODEL), VirtualClock(), autostart=False)


def step(engine: Engine, times: int = 1) -> None:
    async def run() -> None:
        for _ in range(times):
            await engine.step()

    asyncio.run(run())


def run_until_done(engine: Engine, seqs: list[Sequence], limit: int = 100_000) -> int:
    """Step until every sequence finished; returns the number of steps taken."""

    async def run() -> int:
        steps = 0
        while not all(s.finished for s in seqs):
            await engine.step()
            steps += 1
            assert steps < limit, "sequences never finished"
        return steps

    return asyncio.run(run())


def metric(engine: Engine, name: str, **labels: str) -> float:
    value = engine.metrics.registry.get_sample_value(
        name, {"model_name": MODEL, "engine": "0", **labels}
    )
    assert value is not None, f"no sample {name} {labels}"
    return value


def seq(
    prompt: int = 10, tokens: int = 5, priority: int = 0, blocks: tuple[int, ...] = ()
) -> Sequence:
    return Sequence(
        prompt_tokens=prompt, target_tokens=tokens, priority=priority, block_hashes=blocks
    )
