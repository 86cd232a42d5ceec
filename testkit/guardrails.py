"""Guardrails run in the test's own process against the real guardrail service, for the
stages a test drives directly (a stream's windows, a whole answer): the service client over
the gateway's own fleet client; the fleet seam unused; findings buffered, never flushed (the
accounting writer is not started, so its Valkey client never connects)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import valkey
import valkey.asyncio as avalkey

from gateway.accounting import GUARDRAILS_STREAM, Accounting
from gateway.guardrails.client import FleetCaller, ServiceClient
from gateway.guardrails.run import Guardrails
from gateway.metrics import GatewayMetrics
from gateway.policy import Model, Principal
from gateway.upstream import Upstream
from ops.processes import wait_until


@contextlib.asynccontextmanager
async def service_guardrails(url: str) -> AsyncIterator[Guardrails]:
    client = avalkey.Valkey.from_url("valkey://127.0.0.1:1/0")  # never connects: not started
    upstream = Upstream(connect_timeout_s=2.0, max_connections=4)
    metrics = GatewayMetrics(process_collectors=False)
    try:
        yield Guardrails(
            service=ServiceClient(upstream, url, 10.0),
            fleet=FleetCaller(None, None, upstream),  # type: ignore[arg-type]
            metrics=metrics,
            accounting=Accounting(client, metrics=metrics),
            retry_after_s=5,
        )
    finally:
        await upstream.close()
        await client.aclose()


ALICE = Principal(
    key_id=1, key_prefix="sk-test", tenant="t", tenant_id=1, environment="prod",
    use_case="u", use_case_id=1, namespace="prod", models=frozenset({"m"}), expires_at=None,
)  # fmt: skip
MODEL = Model("m", "m", frozenset({"chat"}), ("http://127.0.0.1:1",), 10.0, None)


@dataclass
class Subject:
    """What a stage's findings name (gateway.guardrails.run.Subject): a request of one key."""

    request_id: str = "r1"
    record_id: str = "r1"
    principal: Principal = ALICE
    model: Model = MODEL


def recorded_findings(client: valkey.Valkey, count: int) -> list[dict[str, str]]:
    """The findings a gateway (or a batcher) wrote to the guardrails stream, once there are
    ``count`` of them, and exactly that many."""

    def entries() -> list[dict[str, str]]:
        raw = client.xrange(GUARDRAILS_STREAM)
        return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in raw]

    assert wait_until(lambda: len(entries()) >= count, timeout=10), entries()
    found = entries()
    assert len(found) == count, found
    return found
