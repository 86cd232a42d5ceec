"""Admission's keys by slot (gateway/slots.py, docs/gateway-scheduling.md "Valkey key layout"):
a model pool's keys in the pool's slot, the limits and max-concurrent counts that span pools
in the tenant's, the global limit and the registry of pools in the shared one — checked on
what a real Valkey holds after real admissions, with Valkey Cluster's own slot function."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import valkey
from valkey.crc import key_slot

from gateway.admission import limits_for
from gateway.scheduling import QueueTimeout, Ticket, keys, ticket_for
from tests.gateway.scheduling.conftest import (
    R1,
    R2,
    eventually,
    running_schedulers,
    write_fresh_fleet,
)
from tests.gateway.scheduling.test_rate_limiter import ALICE, POLICY_SECTIONS, rule, snapshot

SHARED = key_slot(keys.KEY_PREFIX.encode())


def slot_of(prefix: str) -> int:
    return key_slot(prefix.encode())


def _ticket(request_id: str, model: str) -> Ticket:
    return Ticket(
        request_id=request_id,
        model=model,
        replicas=((R1, 1),),
        rank=1,
        priority_class="prod",
        queue_timeout_s=5.0,
        max_queue_length=10,
        tenant="acme",
        use_case_id=1,
        cost=10,
    )


def test_each_limit_is_placed_in_the_slot_of_what_it_spans():
    """GIVEN the global, model, tenant, tenant × model and use-case limits of a policy
    WHEN limits_for lists alice's on llama
    THEN the global one is in the shared slot, the model and tenant × model ones in llama's
    pool slot, the tenant and use-case ones in acme's slot — and those are three slots."""
    limits = limits_for(snapshot(**POLICY_SECTIONS), ALICE, "llama", 1_000)
    placed = {limit.id.rsplit(":", 1)[0]: slot_of(limit.stem) for limit in limits}
    pool, tenant = slot_of(keys.pool_prefix("llama")), slot_of(keys.account_prefix("acme"))
    assert placed == {
        "p:everyone": SHARED,
        "p:llama-pool": pool,
        "p:acme-burst": tenant,
        "p:acme-llama": pool,
        "uc:12": tenant,
    }
    assert len({SHARED, pool, tenant}) == 3
    # A model's prefix and a tenant's of the same name never meet ("@" is not in model ids).
    assert keys.pool_prefix("acme") != keys.account_prefix("acme")


async def test_every_key_two_pools_write_is_in_its_own_pools_slot(
    valkey_client: valkey.Valkey, valkey_url: str
):
    """GIVEN a policy with limits of every scope and a use case capped at 4 concurrent
    WHEN alice's requests are granted and queued on two models (llama, qwen), and one times
    out in the queue
    THEN every key Valkey holds is in llama's pool slot, qwen's, acme's tenant slot or the
    shared slot; each pool's queue, leases, in-flight counts, fleet view and heartbeats are
    in that pool's slot; the use case's concurrency count is in acme's slot."""
    rules = [r for r in POLICY_SECTIONS["rate_limits"] if "qwen" not in r["name"]]  # type: ignore[attr-defined]
    rules.append(rule("qwen-roomy", "tenant_model", tenant="acme", model="qwen", tpm=10**9))
    policy = snapshot(**{**POLICY_SECTIONS, "rate_limits": rules})
    async with running_schedulers(valkey_url, stale_ms=60_000) as [scheduler]:
        client = scheduler._client
        tickets: dict[str, Ticket] = {}
        for model in ("llama", "qwen"):
            await write_fresh_fleet(client, [R1, R2], model=model)
            base = ticket_for(
                policy,
                ALICE,
                policy.models[model],
                request_id=f"{model}-0",
                cost=10,
                limits=limits_for(policy, ALICE, model, 10),
            )
            tickets[model] = replace(base, replicas=((R1, 1), (R2, 1)), queue_timeout_s=0.3)
        held = [
            await scheduler.acquire(replace(tickets["llama"], request_id=f"llama-{n}"))
            for n in range(2)
        ]
        held.append(await scheduler.acquire(tickets["qwen"]))
        # llama is full (two replicas, cap 1): the next one waits, and times out.
        try:
            await scheduler.acquire(replace(tickets["llama"], request_id="llama-late"))
        except QueueTimeout:
            pass
        else:
            raise AssertionError("the third llama request should have waited and timed out")

        found: list[str] = [k.decode() for k in valkey_client.keys("sy:{sy*")]
        slots = {
            "llama": slot_of(keys.pool_prefix("llama")),
            "qwen": slot_of(keys.pool_prefix("qwen")),
            "acme": slot_of(keys.account_prefix("acme")),
            "shared": SHARED,
        }
        assert len(set(slots.values())) == 4
        assert {key_slot(k.encode()) for k in found} <= set(slots.values()), found
        for model in ("llama", "qwen"):
            for key in (
                keys.leases(model),
                keys.in_flight(model),
                keys.fleet(model),
                keys.pool(model),
                keys.gateways(model),
            ):
                assert key in found, key
                assert key_slot(key.encode()) == slots[model]
        assert key_slot(keys.concurrency("acme", 12).encode()) == slots["acme"]
        assert valkey_client.get(keys.concurrency("acme", 12)) == b"3"
        registry: Any = valkey_client.smembers(keys.pools())
        assert set(registry) == {b"llama", b"qwen"}

        for grant in held:
            await scheduler.release(grant)
        assert valkey_client.exists(keys.concurrency("acme", 12)) == 0


async def test_a_gateway_reaps_the_pools_of_a_dead_gateway_it_never_used(
    valkey_client: valkey.Valkey, valkey_url: str
):
    """GIVEN gateway A holding a lease on qwen (heartbeat 300 ms), and gateway B that only
    ever served llama
    WHEN A dies
    THEN B's reaper — walking the shared registry of pools — gives qwen's capacity back."""
    options: dict[str, Any] = {"reap_interval_s": 0.05, "heartbeat_ms": 300}
    async with running_schedulers(valkey_url, 2, **options) as [a, b]:
        client = b._client
        for model in ("llama", "qwen"):
            await write_fresh_fleet(client, [R1], model=model)
        qwen = _ticket("held", "qwen")
        await a.acquire(qwen)
        await b.release(await b.acquire(replace(qwen, request_id="b", model="llama")))
        assert int(await client.zcard(keys.leases("qwen"))) == 1

        for task in a._tasks:  # A stops heartbeating, as a killed process would
            task.cancel()

        async def qwen_free() -> bool:
            return int(await client.zcard(keys.leases("qwen"))) == 0

        await eventually(qwen_free, timeout_s=5.0, message="qwen's lease was never reaped")
        await a.close()


async def test_the_heartbeat_puts_a_pool_back_in_the_registry_after_valkey_lost_it(
    valkey_client: valkey.Valkey, valkey_url: str
):
    """GIVEN a gateway that joined llama's pool
    WHEN Valkey loses its data (FLUSHALL, as a restart without persistence would)
    THEN within a heartbeat the pool is back in the registry and the gateway's heartbeat in
    the pool's slot, so reapers walk it again."""
    async with running_schedulers(valkey_url, reap_interval_s=0.05, heartbeat_ms=300) as [s]:
        await write_fresh_fleet(s._client, [R1], model="llama")
        grant = await s.acquire(_ticket("r", "llama"))
        await s.release(grant)
        valkey_client.flushall()

        async def back() -> bool:
            heartbeat: Any = valkey_client.zscore(keys.gateways("llama"), s.gateway_id)
            return valkey_client.sismember(keys.pools(), "llama") == 1 and (heartbeat or 0) > 0

        await eventually(back, timeout_s=3.0, message="the pool never came back")
