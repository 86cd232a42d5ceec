"""The FleetCaller that fleet-run guardrails (a guard model, an embedding model) ask models
through: a grant from the real scheduler, a POST over the gateway's fleet client to a real
simulator replica, the capacity released after; the caller's rate limits play no part."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import valkey
import valkey.asyncio as avalkey

from gateway.guardrails.client import FleetCaller, GuardrailUnavailable
from gateway.policy_store import PolicyStore
from gateway.scheduling import Scheduler, fleet_entry, wall_ms, write_fleet
from gateway.upstream import Upstream
from testkit.policy import PolicyBuilder
from tests.conftest import SimulatorFactory

GUARD = "llama-guard-test"


async def _with_caller(valkey_url: str, body: Any) -> Any:
    client = avalkey.Valkey.from_url(valkey_url)
    store = PolicyStore(client, refresh_s=1.0, max_staleness_s=60.0)
    await store.refresh()
    scheduler = Scheduler(client, stale_ms=60_000)
    upstream = Upstream(connect_timeout_s=2.0, max_connections=10)
    await scheduler.start()
    await upstream.start()
    try:
        model = store.current().models[GUARD]
        entry = fleet_entry(waiting=0, running=0, kv_usage=0.1, scraped_at_ms=wall_ms())
        await write_fleet(client, GUARD, dict.fromkeys(model.replicas, entry))
        return await body(FleetCaller(store, scheduler, upstream), scheduler)
    finally:
        await upstream.close()
        await scheduler.close()
        await client.aclose()


def test_a_fleet_check_is_granted_capacity_posted_and_released(
    valkey_client: valkey.Valkey, valkey_url: str, start_simulator: SimulatorFactory
):
    """GIVEN a guard model with one slot per replica and a 1 request/minute limit on it
    WHEN a fleet-run check asks it three times THEN each call is answered (the limit is the
    callers', not the guardrail's) and each grant is released (the one slot serves them all),
    under the served name."""
    guard = start_simulator("served-guard", "--time-scale", "0.01")
    policy = PolicyBuilder()
    policy.model(
        GUARD,
        [guard.base_url],
        capabilities=("guard",),
        served_name="served-guard",
        max_in_flight_per_replica=1,
    )
    policy.rate_limits.append(
        {
            "name": "guard-rpm",
            "scope": "model",
            "model": GUARD,
            "tenant": None,
            "requests_per_minute": 1,
            "tokens_per_minute": None,
            "tokens_per_day": None,
        }
    )
    policy.priority_class("prod", rank=1)
    policy.publish(valkey_client)

    async def three_calls(caller: FleetCaller, scheduler: Scheduler) -> list[Any]:
        answers = []
        for _ in range(3):
            answers.append(
                await caller.post_json(
                    GUARD,
                    "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "is this safe?"}], "max_tokens": 3},
                    priority_class="prod",
                )
            )
        return answers

    answers = asyncio.run(_with_caller(valkey_url, three_calls))
    assert len(answers) == 3
    for answer in answers:
        assert answer["model"] == "served-guard"
        assert answer["choices"][0]["message"]["content"]


def test_a_model_missing_from_the_policy_is_a_clear_failure(
    valkey_client: valkey.Valkey, valkey_url: str, start_simulator: SimulatorFactory
):
    guard = start_simulator("served-guard", "--time-scale", "0.01")
    PolicyBuilder().model(GUARD, [guard.base_url]).publish(valkey_client)

    async def ask_another(caller: FleetCaller, scheduler: Scheduler) -> None:
        await caller.post_json("no-such-guard", "/v1/chat/completions", {}, priority_class="x")

    with pytest.raises(GuardrailUnavailable, match="no-such-guard"):
        asyncio.run(_with_caller(valkey_url, ask_another))
