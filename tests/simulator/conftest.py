"""The contract tests' server: a real vLLM when SWITCHYARD_LIVE_VLLM_URL says where, else one
simulator process configured like the live one (tests/live/run.sh)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ops.processes import PYTHON, ManagedProcess, free_port, http_ready
from tests.simulator.client import get

LIVE_URL = os.environ.get("SWITCHYARD_LIVE_VLLM_URL")
LIVE_MODEL = os.environ.get("SWITCHYARD_LIVE_VLLM_MODEL", "")
# Mirrors tests/live/serve.sh + run.sh: SmolLM2 with a 2048-token context, priority scheduling.
SIMULATED_MODEL = "smollm2-135m"
SIMULATOR_FLAGS = (
    "--max-model-len",
    "2048",
    "--scheduling-policy",
    "priority",
    "--time-scale",
    "0",
)


@dataclass(frozen=True)
class Target:
    base_url: str
    model: str
    max_model_len: int


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    """One server for the whole contract module, as the live run has."""
    process = None
    if LIVE_URL:
        base_url, model = LIVE_URL.rstrip("/"), LIVE_MODEL
    else:
        port = free_port()
        base_url, model = f"http://127.0.0.1:{port}", SIMULATED_MODEL
        process = ManagedProcess(
            f"simulator-contract-{port}",
            [
                PYTHON, "-m", "simulator", "--host", "127.0.0.1", "--port", str(port),
                "--served-model-name", model, *SIMULATOR_FLAGS,
            ],
        )  # fmt: skip
        process.start(ready=http_ready(f"{base_url}/health"), timeout=20)
    try:
        card = next(m for m in get(base_url, "/v1/models").json()["data"] if m["id"] == model)
        yield Target(base_url, model, card["max_model_len"])
    finally:
        if process is not None:
            process.stop()
