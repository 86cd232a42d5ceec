"""Fault injection: errors, hangs, slow first bytes, streams cut mid-way, replica death.

Every inference request draws its fate from one seeded generator, always the same number
of draws whatever the rates, so a run under ``--seed`` is reproducible request by request.
Settings come from the command line and can be changed at runtime (``POST /sim/faults``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass

from simulator.asgi import DisconnectWatch, Send, send_response
from simulator.config import FaultSettings
from simulator.errors import bad_request, internal_error

# A cut stream still delivers a few tokens first, like a replica dying under load.
CUT_AFTER_MIN_TOKENS = 1
CUT_AFTER_MAX_TOKENS = 4

_FIELDS = {f.name for f in dataclasses.fields(FaultSettings)}


@dataclass(frozen=True, slots=True)
class FaultPlan:
    error: bool = False
    hang: bool = False
    slow_first_byte_s: float = 0.0
    cut_stream_after_tokens: int | None = None
    exit_after_response: bool = False


NO_FAULTS = FaultPlan()


class FaultInjector:
    def __init__(self, settings: FaultSettings, seed: int) -> None:
        self._settings = settings
        self._rng = random.Random(seed)  # noqa: S311 (reproducible draws, not secrets)
        self._served = 0

    @property
    def settings(self) -> FaultSettings:
        return self._settings

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self._settings)

    def update(self, changes: Mapping[str, object]) -> FaultSettings:
        """Apply a partial update; ``seed`` restarts the random sequence.

        Keys may be spelled as the flags are (``fault-error-rate``) or as fields
        (``error_rate``, ``fault_error_rate``).
        """
        values: dict[str, object] = {}
        seed: object = None
        for key, value in changes.items():
            name = key.lstrip("-").replace("-", "_").removeprefix("fault_")
            if name == "seed":
                seed = value
            elif name in _FIELDS:
                values[name] = value
            else:
                raise bad_request(f"Unknown fault setting: {key!r}", param=key)
        for name, value in values.items():
            if name == "die_after_requests":
                if value is not None and (type(value) is not int):
                    raise bad_request(f"{name} must be an integer or null", param=name)
            elif type(value) not in (int, float):
                raise bad_request(f"{name} must be a number", param=name)
        if seed is not None and type(seed) is not int:
            raise bad_request("seed must be an integer", param="seed")
        try:
            settings = dataclasses.replace(self._settings, **values)  # type: ignore[arg-type]
        except ValueError as exc:
            raise bad_request(str(exc)) from exc
        self._settings = settings
        if "die_after_requests" in values:
            self._served = 0
        if isinstance(seed, int):
            self._rng.seed(seed)
        return settings

    def plan(self, *, streaming: bool) -> FaultPlan:
        s = self._settings
        r = self._rng
        error_draw, hang_draw, cut_draw = r.random(), r.random(), r.random()
        cut_tokens = r.randint(CUT_AFTER_MIN_TOKENS, CUT_AFTER_MAX_TOKENS)
        self._served += 1
        exit_after = s.die_after_requests is not None and self._served >= s.die_after_requests
        if not (s.error_rate or s.hang_rate or s.slow_first_byte_ms or s.die_mid_stream_rate):
            return FaultPlan(exit_after_response=True) if exit_after else NO_FAULTS
        return FaultPlan(
            error=error_draw < s.error_rate,
            hang=hang_draw < s.hang_rate,
            slow_first_byte_s=s.slow_first_byte_ms / 1000.0,
            cut_stream_after_tokens=(
                cut_tokens if streaming and cut_draw < s.die_mid_stream_rate else None
            ),
            exit_after_response=exit_after,
        )


async def strike_before_work(plan: FaultPlan, watch: DisconnectWatch, send: Send) -> bool:
    """Play the faults that strike before any work is done; True if the request is over."""
    if plan.slow_first_byte_s and await watch.wait(plan.slow_first_byte_s):
        return True  # the client gave up while we dawdled
    if plan.error:
        err = internal_error("Simulated engine failure (injected fault).")
        await send_response(send, err.status, err.body())
        return True
    if plan.hang:
        await watch.wait()
        return True
    return False


class CutStreamLogFilter(logging.Filter):
    """Hides uvicorn's complaint about the streams we cut on purpose, and only those."""

    def __init__(self) -> None:
        super().__init__()
        self.expected = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if self.expected and record.getMessage().startswith(
            "ASGI callable returned without completing response"
        ):
            self.expected -= 1
            return False
        return True


CUT_STREAM_LOG_FILTER = CutStreamLogFilter()


def exit_process_soon() -> None:
    """Die like a crashed replica: no cleanup, no goodbye, sockets closed by the kernel.

    Deferred by one loop iteration so that the response just sent leaves the process first.
    """
    asyncio.get_running_loop().call_soon(os._exit, 1)
