"""What one simulator process holds: its configuration, engine, metrics and fault injector."""

from __future__ import annotations

import logging
import random

from simulator.config import SimulatorConfig
from simulator.engine import Clock, Engine
from simulator.faults import FaultInjector
from simulator.metrics import SimulatorMetrics
from simulator.tokens import stable_key

# Bodies beyond this are refused before parsing; transcriptions carry audio files.
MAX_BODY_BYTES = 64 * 1024 * 1024
# The vLLM release whose behaviour is reproduced (tests/live/OBSERVED.md).
VLLM_VERSION = "0.32.0"


def system_fingerprint(config: SimulatorConfig) -> str:
    """vLLM's ``vllm-<version>-<hash8>``; its hash covers the model and engine settings."""
    digest = stable_key(config.model_root, config.max_model_len, config.kind, config.block_size)
    return f"vllm-{VLLM_VERSION}-{digest >> 32:08x}"


class Simulator:
    def __init__(self, config: SimulatorConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.metrics = SimulatorMetrics(config.model_name)
        self.engine = Engine(config, self.metrics, clock)
        self.faults = FaultInjector(config.faults, config.seed)
        self.fingerprint = system_fingerprint(config)
        # Request ids are random in vLLM too; they must not depend on --seed.
        self._ids = random.Random()  # noqa: S311 (ids, not secrets)
        self.log = logging.getLogger("simulator")

    def request_id(self, client_id: bytes | None) -> str:
        """vLLM's id body: the client's X-Request-Id, else 16 random hex digits."""
        if client_id:
            return client_id.decode("latin-1")
        return f"{self._ids.getrandbits(64):016x}"
