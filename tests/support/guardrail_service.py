"""Start the real guardrail service (``python -m guardrails.service``) for a test, with the
test detectors registered through SWITCHYARD_GUARDRAIL_DETECTORS."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from config.processes import PYTHON, ManagedProcess, free_port, http_ready
from tests.support.guardrail_detectors import SPEC


class RunningGuardrailService:
    def __init__(self, process: ManagedProcess, port: int) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def checks_answered(self) -> float:
        """Check requests this service has answered, whatever their outcome (its metrics)."""
        text = httpx.get(self.url + "/metrics").text
        total = 0.0
        for line in text.splitlines():
            if line.startswith("switchyard_guardrail_service_checks_total{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


GuardrailServiceFactory = Callable[..., RunningGuardrailService]


@pytest.fixture
def start_guardrail_service() -> Iterator[GuardrailServiceFactory]:
    started: list[ManagedProcess] = []

    def start(**env: str) -> RunningGuardrailService:
        port = free_port()
        process = ManagedProcess(
            f"guardrails-{port}",
            [PYTHON, "-m", "guardrails.service"],
            env={
                "SWITCHYARD_GUARDRAIL_PORT": str(port),
                "SWITCHYARD_GUARDRAIL_WORKERS": "1",
                "SWITCHYARD_GUARDRAIL_DETECTORS": SPEC,
                "SWITCHYARD_GUARDRAIL_PRELOAD": "words",
                **env,
            },
        )
        started.append(process)
        process.start(ready=http_ready(f"http://127.0.0.1:{port}/healthz", expect=200), timeout=60)
        return RunningGuardrailService(process, port)

    try:
        yield start
    finally:
        for process in reversed(started):
            process.stop()
