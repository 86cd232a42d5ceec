"""Admission with split slots (``Scheduler(split_slots=True)``, for a Valkey Cluster): the limits
and max-concurrent counts outside a pool's slot are charged by account.lua on their own slots
before acquire.lua runs on the pool's (docs/gateway-scheduling.md, "Scale-out"). Against a
real valkey-server: the split holds what the single script holds — limits exact across pools,
a refusal anywhere costs nothing, a request never served gives its charge back, max
concurrent spans pools — and a dead gateway's requests leave the use case's set on expiry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest
import valkey
import valkey.asyncio as avalkey

from gateway.admission import MINUTE_MS, Limit, reconcile_args
from gateway.scheduling import (
    MaxConcurrent,
    QueueFull,
    QueueLost,
    QueueTimeout,
    RateLimited,
    Scheduler,
    Ticket,
    fleet_entry,
    keys,
    write_fleet,
)
from gateway.scheduling.accounts import split
from tests.gateway.scheduling.conftest import R1, R2

NOW = 1_000 * MINUTE_MS + 10_000
TENANT = "acme"
UC = 12
MODELS = ("llama", "qwen")


def uc_limit(kind: str, limit: int, cost: int) -> Limit:
    """A use-case limit, in the tenant's slot as limits_for places it."""
    suffix = "rpm" if kind == "req" else "tpm"
    return Limit(
        f"uc:{UC}:{suffix}",
        kind,  # type: ignore[arg-type]
        MINUTE_MS,
        limit,
        cost,
        f"use case chatbot {suffix}",
        keys.account_prefix(TENANT),
    )


def model_limit(model: str, limit: int) -> Limit:
    return Limit(
        f"p:{model}-pool:rpm", "req", MINUTE_MS, limit, 1, f"model {model}", keys.pool_prefix(model)
    )


GLOBAL = Limit("p:everyone:rpm", "req", MINUTE_MS, 1_000, 1, "global requests per minute")


def ticket(request_id: str, model: str = "llama", *limits: Limit, **changes: Any) -> Ticket:
    base = Ticket(
        request_id=request_id,
        model=model,
        replicas=((R1, 1), (R2, 1)),
        rank=1,
        priority_class="prod",
        queue_timeout_s=5.0,
        max_queue_length=100,
        tenant=TENANT,
        use_case_id=UC,
        cost=100,
        limits=limits,
    )
    return replace(base, **changes)


@asynccontextmanager
async def split_scheduler(
    url: str, clock: list[int] | None = None, **options: Any
) -> AsyncIterator[Scheduler]:
    client = avalkey.Valkey.from_url(url)
    scheduler = Scheduler(
        client,
        gateway_id=options.pop("gateway_id", "gw-split"),
        clock=(lambda: clock[0]) if clock is not None else None,
        stale_ms=10**13,  # the fleet entries are stamped NOW, in 1970
        split_slots=True,
        **options,
    )
    entry = fleet_entry(waiting=0, running=0, kv_usage=0.0, scraped_at_ms=NOW)
    for model in MODELS:
        await write_fleet(client, model, {R1: entry, R2: entry})
    await scheduler.start()
    try:
        yield scheduler
    finally:
        await scheduler.close()
        await client.aclose()


def counted(client: valkey.Valkey, limit: Limit, now: int = NOW) -> int:
    value: Any = client.get(keys.rate_window(limit.stem, now // limit.window_ms))
    return int(value or 0)


def in_use_case(client: valkey.Valkey) -> int:
    return int(client.zcard(keys.concurrency(TENANT, UC)))  # type: ignore[arg-type]


def test_a_ticket_splits_into_its_pool_part_and_one_account_per_other_slot():
    """GIVEN a ticket with a global, a model and two use-case limits and a max concurrent
    WHEN split
    THEN acquire.lua keeps only the model's limit and no max concurrent; the tenant's
    account has the use-case limits and the concurrency set; the shared one the global."""
    rpm, tpm = uc_limit("req", 10, 1), uc_limit("tok", 10_000, 500)
    pool = model_limit("llama", 100)
    accounts, local = split(ticket("t", "llama", GLOBAL, pool, rpm, tpm, max_concurrent=3))
    assert local.limits == (pool,)
    assert local.max_concurrent == 0
    by_slot = {account.slot: account for account in accounts}
    assert set(by_slot) == {keys.account_prefix(TENANT), keys.KEY_PREFIX}
    tenant = by_slot[keys.account_prefix(TENANT)]
    assert tenant.limits == (rpm, tpm)
    assert tenant.positions == (2, 3)
    assert tenant.concurrency_key == keys.concurrency(TENANT, UC)
    assert by_slot[keys.KEY_PREFIX].limits == (GLOBAL,)
    assert by_slot[keys.KEY_PREFIX].concurrency_key == ""


async def test_a_use_case_limit_is_exact_across_two_pools(valkey_client, valkey_url):
    """GIVEN a use case allowed 3 requests a minute, calling llama and qwen in turn
    WHEN 4 requests come
    THEN 3 are admitted, the 4th is refused on the use-case limit, and the count (3) is in
    the tenant's slot, none in either pool's."""
    clock = [NOW]
    rpm = uc_limit("req", 3, 1)
    async with split_scheduler(valkey_url, clock) as scheduler:
        grants = [await scheduler.acquire(ticket(f"r{n}", MODELS[n % 2], rpm)) for n in range(3)]
        with pytest.raises(RateLimited) as refused:
            await scheduler.acquire(ticket("r3", "qwen", rpm))
        assert refused.value.limit == rpm
        assert counted(valkey_client, rpm) == 3
        assert valkey_client.keys(keys.pool_prefix("[^@]*") + "rl:*") == []  # no pool's slot
        for grant in grants:
            await scheduler.release(grant)


async def test_a_refusal_on_one_slot_costs_nothing_on_the_others(valkey_client, valkey_url):
    """GIVEN a roomy global limit and a model limit already full
    WHEN a request is refused by the pool (its model limit)
    THEN the global and use-case charges it got first are given back."""
    clock = [NOW]
    roomy = uc_limit("tok", 1_000_000, 500)
    full = model_limit("llama", 1)
    async with split_scheduler(valkey_url, clock) as scheduler:
        held = await scheduler.acquire(ticket("first", "llama", GLOBAL, full, roomy))
        assert (counted(valkey_client, GLOBAL), counted(valkey_client, roomy)) == (1, 500)
        with pytest.raises(RateLimited) as refused:
            await scheduler.acquire(ticket("second", "llama", GLOBAL, full, roomy))
        assert refused.value.limit == full

        async def refunded() -> bool:
            return (counted(valkey_client, GLOBAL), counted(valkey_client, roomy)) == (1, 500)

        await _eventually(refunded)
        await scheduler.release(held)


async def test_a_full_queue_and_a_queue_timeout_give_the_charge_back(valkey_client, valkey_url):
    """GIVEN both replicas of llama held
    WHEN one request finds the queue full (max queue length 0) and another times out waiting
    THEN neither is left counted on the use case's limit or in its concurrency set."""
    rpm = uc_limit("req", 100, 1)
    async with split_scheduler(valkey_url) as scheduler:
        held = [
            await scheduler.acquire(ticket(f"h{n}", "llama", rpm, max_concurrent=10))
            for n in range(2)
        ]
        with pytest.raises(QueueFull):
            await scheduler.acquire(ticket("full", "llama", rpm, max_queue_length=0))
        with pytest.raises(QueueTimeout):
            await scheduler.acquire(ticket("late", "llama", rpm, queue_timeout_s=0.2))

        async def two_left() -> bool:
            return _counted_now(valkey_client, rpm) == 2 and in_use_case(valkey_client) == 2

        await _eventually(two_left)
        for grant in held:
            await scheduler.release(grant)
        assert in_use_case(valkey_client) == 0


async def test_a_lost_place_in_the_queue_gives_the_charge_back(valkey_client, valkey_url):
    """GIVEN both replicas of llama held and a request waiting, charged on its use case
    WHEN its place in the pool's slot disappears (the pool's primary failed over to a replica
    that never had it), while the tenant's slot kept the charge
    THEN the request is refused as queue_lost and the tenant's slot gives its charge back."""
    rpm = uc_limit("req", 100, 1)
    async with split_scheduler(valkey_url) as scheduler:
        held = [
            await scheduler.acquire(ticket(f"h{n}", "llama", rpm, max_concurrent=10))
            for n in range(2)
        ]
        waiting = asyncio.create_task(
            scheduler.acquire(ticket("late", "llama", rpm, max_concurrent=10, queue_timeout_s=60))
        )

        async def three_counted() -> bool:
            return _counted_now(valkey_client, rpm) == 3 and in_use_case(valkey_client) == 3

        await _eventually(three_counted)
        pool = keys.pool_prefix("llama")
        [place] = valkey_client.zrange(keys.queue("llama"), 0, -1)
        valkey_client.delete(f"{pool}qi:{place.decode()}")
        valkey_client.zrem(keys.queue("llama"), place)

        with pytest.raises(QueueLost):
            await asyncio.wait_for(waiting, timeout=20)

        async def two_left() -> bool:
            return _counted_now(valkey_client, rpm) == 2 and in_use_case(valkey_client) == 2

        await _eventually(two_left)
        for grant in held:
            await scheduler.release(grant)


async def test_max_concurrent_spans_pools(valkey_client, valkey_url):
    """GIVEN a use case capped at 2 concurrent
    WHEN it holds one request on llama and one on qwen
    THEN a third on either is refused as max_concurrent, and after a release it fits."""
    async with split_scheduler(valkey_url) as scheduler:
        on_llama = await scheduler.acquire(ticket("a", "llama", max_concurrent=2))
        on_qwen = await scheduler.acquire(ticket("b", "qwen", max_concurrent=2))
        with pytest.raises(MaxConcurrent):
            await scheduler.acquire(ticket("c", "llama", max_concurrent=2))
        await scheduler.release(on_llama)

        async def freed() -> bool:
            return in_use_case(valkey_client) == 1

        await _eventually(freed)
        third = await scheduler.acquire(ticket("c", "qwen", max_concurrent=2))
        await scheduler.release(on_qwen)
        await scheduler.release(third)


async def test_a_release_settles_the_tokens_on_the_tenants_slot(valkey_client, valkey_url):
    """GIVEN a request estimated at 8,000 tokens against a use-case tokens/min limit
    WHEN it used 1,000
    THEN its release corrects the window in the tenant's slot to 1,000."""
    clock = [NOW]
    tpm = uc_limit("tok", 100_000, 8_000)
    async with split_scheduler(valkey_url, clock) as scheduler:
        grant = await scheduler.acquire(ticket("a", "llama", tpm))
        assert counted(valkey_client, tpm) == 8_000
        corrections = reconcile_args((tpm,), admitted_ms=grant.admitted_ms, actual_tokens=1_000)
        await scheduler.release(grant, corrections)

        async def settled() -> bool:
            return counted(valkey_client, tpm) == 1_000

        await _eventually(settled)


async def test_a_dead_gateways_requests_leave_the_use_case_set_when_they_expire(
    valkey_client, valkey_url
):
    """GIVEN gateway A holding the use case's only concurrent slot (cap 1, lease 300 ms)
    WHEN A dies without releasing
    THEN gateway B is refused until A's entry expires (its queue timeout + lease), then
    admitted — the use case is not blocked for ever."""
    options: dict[str, Any] = {"lease_ms": 300, "reap_interval_s": 0.05, "heartbeat_ms": 300}
    async with split_scheduler(valkey_url, gateway_id="gw-a", **options) as a:
        await a.acquire(ticket("held", "llama", max_concurrent=1, queue_timeout_s=0.2))
        for task in a._tasks:  # no more heartbeats nor renewals: as a killed process
            task.cancel()
        async with split_scheduler(valkey_url, gateway_id="gw-b", **options) as b:
            with pytest.raises(MaxConcurrent):
                await b.acquire(ticket("b1", "qwen", max_concurrent=1))
            await asyncio.sleep(0.6)  # past the dead entry's expiry (0.2 s + 0.3 s)
            grant = await b.acquire(ticket("b2", "qwen", max_concurrent=1))
            await b.release(grant)


async def test_check_limits_peeks_every_slot_and_names_the_first_refusing_limit(
    valkey_client, valkey_url
):
    """GIVEN a global limit with room and a use-case limit already at its maximum
    WHEN a ticket is checked before its guardrails
    THEN it is refused on the use-case limit, and nothing is counted."""
    clock = [NOW]
    rpm = uc_limit("req", 1, 1)
    async with split_scheduler(valkey_url, clock) as scheduler:
        held = await scheduler.acquire(ticket("a", "llama", GLOBAL, rpm))
        with pytest.raises(RateLimited) as refused:
            await scheduler.check_limits(ticket("b", "qwen", GLOBAL, rpm))
        assert refused.value.limit == rpm
        assert (counted(valkey_client, GLOBAL), counted(valkey_client, rpm)) == (1, 1)
        await scheduler.release(held)


def _counted_now(client: valkey.Valkey, limit: Limit) -> int:
    """The current window at Valkey's clock (tests without a driven clock)."""
    names: Any = client.keys(limit.stem + ":*")
    values: list[Any] = [client.get(name) for name in names]
    return sum(int(value or 0) for value in values)


async def _eventually(predicate: Any, timeout_s: float = 3.0) -> None:
    """Refunds and settles go out without the caller waiting for them."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("not reached in time")
        await asyncio.sleep(0.01)
