"""One gateway stack for a whole test module: its own Valkey, simulator replicas, a fleet
watcher, optionally the guardrail service, and a gateway — the same processes and readiness
probes as the per-test fixtures (testkit/stack.py), started once.

For modules whose many parametrised cases each send one request and read one answer: they
share the stack instead of starting five processes per case. The stack has a Valkey of its
own, so the per-test FLUSHDB of ``valkey_client`` (other modules) never reaches it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import valkey

from ops.processes import fleet_is_written
from testkit.guardrail_detectors import SERVICE_ENV
from testkit.policy import PolicyBuilder
from testkit.stack import TEST_CADENCE, Stack, running_stack

# Their processes may load models (the guardrail service) on a machine the other tests share.
START_TIMEOUT = 60


class ModuleStack:
    def __init__(self, stack: Stack, guardrail_url: str = "") -> None:
        self._stack = stack
        running = stack.valkey()
        self.valkey: valkey.Valkey = running.client
        self.url = running.url
        self.guardrail_url = guardrail_url
        self._batchers = 0

    def simulator(self, model: str, *extra: str) -> str:
        """A vLLM simulator replica serving ``model``; its base URL."""
        return self._stack.simulator(model, *extra, timeout=START_TIMEOUT).base_url

    def gateway(self, policy: PolicyBuilder, **env: str) -> str:
        """Publish ``policy``, start the fleet watcher and a gateway; the gateway's base URL."""
        policy.publish(self.valkey)
        common = {"SWITCHYARD_VALKEY_URL": self.url, **TEST_CADENCE}
        self._stack.fleet_watcher(
            common, ready=fleet_is_written(self.valkey), timeout=START_TIMEOUT
        )
        if self.guardrail_url:
            env = {"SWITCHYARD_GUARDRAIL_URL": self.guardrail_url, **env}
        return self._stack.gateway({**common, **env}, timeout=START_TIMEOUT).base_url

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
        self._stack.batcher(
            {**common, **env}, name=f"batcher-{self._batchers}", timeout=START_TIMEOUT
        )
        self._batchers += 1


@contextlib.contextmanager
def module_stack(
    *, guardrail_service: bool = False, guardrail_env: dict[str, str] | None = None
) -> Iterator[ModuleStack]:
    """A Valkey of the stack's own (and the guardrail service with the test detectors, when
    asked, with ``guardrail_env`` added to its environment); every process is stopped on the
    way out, last started first."""
    with running_stack() as stack:
        module = ModuleStack(stack)
        if guardrail_service:
            env = {**SERVICE_ENV, **(guardrail_env or {})}
            module.guardrail_url = stack.guardrail_service(env, timeout=START_TIMEOUT).url
        yield module
