"""A request that ends without a replica answering gives its rate-limit charge and its
fair-share position back (issue 10, item 11): under overload a tenant must not spend its
tokens per minute on 503s. Every path against the real server: queue full, queue timeout,
client cancel while queued, a waiter dropped by the reaper (deadline, dead gateway), a
lease reaped after its expiry.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import valkey
import valkey.asyncio as avalkey

from gateway.admission import MINUTE_MS, Limit
from gateway.scheduling import QueueFull, QueueTimeout, Scheduler, Ticket, keys
from tests.gateway.scheduling.conftest import (
    FOREVER_MS,
    MODEL,
    R1,
    Lua,
    eventually,
    running_schedulers,
    write_fresh_fleet,
)

T0 = 1_800_000_000_000
DAY_MS = 86_400_000
LIMITS = (
    ("rpm", "req", MINUTE_MS, 1_000, 1),
    ("tpm", "tok", MINUTE_MS, 1_000_000, 500),
    ("tpd", "tok", DAY_MS, 10_000_000, 500),
)


def counters(client: valkey.Valkey, now: int) -> dict[str, int]:
    """Every window the limits count in at ``now``: what a refund must restore."""
    found: dict[str, int] = {}
    for limit_id, _, window, _, _ in LIMITS:
        value: Any = client.get(keys.rate_window(limit_id, now // window))
        found[limit_id] = int(value or 0)
    return found


def tenant_finish(client: valkey.Valkey, tenant: str = "acme") -> float:
    value: Any = client.hget(keys.virtual_time(MODEL), f"t:{tenant}")
    return float(value or 0)


@pytest.fixture(autouse=True)
def live_gateways(lua: Lua) -> None:
    lua.heartbeat("gw-a", FOREVER_MS)


def saturate(lua: Lua) -> None:
    """One request (charged) holding R1's only slot, so that the next ones wait."""
    lua.fleet(T0, (R1, 0))
    assert lua.acquire(T0, "holder", tenant="other", limits=LIMITS)[0] == 1


# --- the scripts directly ------------------------------------------------------------------


def test_a_waiter_cancelled_gives_its_charge_and_fair_share_position_back(lua):
    saturate(lua)
    before, finish = counters(lua.client, T0), tenant_finish(lua.client)
    assert lua.acquire(T0, "w", cost=500, limits=LIMITS)[0] == 0
    assert counters(lua.client, T0) == {
        k: v + (1 if k == "rpm" else 500) for k, v in before.items()
    }
    assert tenant_finish(lua.client) == finish + 500

    assert lua.cancel(T0 + 1, "w")[0] == 1

    assert counters(lua.client, T0) == before
    assert tenant_finish(lua.client) == finish


def test_a_grant_that_raced_a_cancel_is_refunded_with_its_release(lua):
    saturate(lua)
    before = counters(lua.client, T0)
    assert lua.acquire(T0, "w", limits=LIMITS)[0] == 0
    lua.release(T0 + 1, "holder")  # grants w, which has not noticed yet
    after_holder = counters(lua.client, T0)

    assert lua.cancel(T0 + 2, "w") == [0, R1]

    assert counters(lua.client, T0) == {
        k: v - (1 if k == "rpm" else 500) for k, v in after_holder.items()
    }
    assert counters(lua.client, T0) == before  # the holder's charge stays: it was served


def test_a_waiter_dropped_at_its_deadline_by_the_reaper_is_refunded(lua):
    saturate(lua)
    before, finish = counters(lua.client, T0), tenant_finish(lua.client)
    assert lua.acquire(T0, "w", deadline=T0 + 500, limits=LIMITS)[0] == 0

    assert [int(v) for v in lua("reap", T0 + 500)] == [0, 1, 0]

    assert counters(lua.client, T0) == before
    assert tenant_finish(lua.client) == finish


def test_a_waiter_dropped_by_a_pump_at_its_deadline_is_refunded(lua):
    saturate(lua)
    before = counters(lua.client, T0)
    assert lua.acquire(T0, "w", deadline=T0 + 500, limits=LIMITS)[0] == 0
    lua.fleet(T0 + 600, (R1, 0))

    assert lua.release(T0 + 600, "holder")[:2] == [1, 0]  # the pump drops w, grants nobody

    assert lua.queue() == []
    assert counters(lua.client, T0) == before


def test_the_waiters_of_a_dead_gateway_are_refunded_when_reaped(lua):
    lua.heartbeat("gw-dead", T0 + 1_000)
    saturate(lua)
    before = counters(lua.client, T0)
    assert lua.acquire(T0, "w", gateway="gw-dead", limits=LIMITS)[0] == 0

    assert [int(v) for v in lua("reap", T0 + 1_001)] == [0, 1, 0]

    assert counters(lua.client, T0) == before


def test_a_lease_reaped_after_its_expiry_is_refunded_and_a_late_release_charges_what_was_used(
    lua,
):
    """GIVEN a granted request whose gateway stopped renewing, WHEN its lease is reaped, THEN
    its charge is given back; and if that gateway was alive after all and releases it with
    what the replica really used (400 tokens of the 500 estimated), the windows end up charged
    exactly that, as if the lease had never been reaped."""
    lua.fleet(T0, (R1, 0))
    before = counters(lua.client, T0)
    assert lua.acquire(T0, "r", lease_ms=1_000, limits=LIMITS)[0] == 1

    assert [int(v) for v in lua("reap", T0 + 1_000)] == [1, 0, 0]
    assert counters(lua.client, T0) == before

    window = T0 // MINUTE_MS
    day = T0 // DAY_MS
    reconcile = [("tpm", MINUTE_MS, window, -100), ("tpd", DAY_MS, day, -100)]
    assert lua.release(T0 + 2_000, "r", reconcile=reconcile)[0] == 0
    assert counters(lua.client, T0) == {
        "rpm": before["rpm"] + 1,
        "tpm": before["tpm"] + 400,
        "tpd": before["tpd"] + 400,
    }


def test_a_refused_request_was_never_charged(lua):
    saturate(lua)
    before = counters(lua.client, T0)
    reply = lua.acquire(T0, "w", max_queue=0, limits=LIMITS)
    assert reply[:2] == [-2, "queue_full"]
    assert counters(lua.client, T0) == before


# --- through the Scheduler, as the gateway calls it -----------------------------------------


def _limits() -> tuple[Limit, ...]:
    return tuple(
        Limit(limit_id, kind, window, limit, cost, limit_id)  # type: ignore[arg-type]
        for limit_id, kind, window, limit, cost in LIMITS
    )


def _ticket(request_id: str, **changes: Any) -> Ticket:
    fields: dict[str, Any] = {
        "request_id": request_id,
        "model": MODEL,
        "replicas": ((R1, 1),),
        "rank": 1,
        "priority_class": "prod",
        "queue_timeout_s": 5.0,
        "max_queue_length": 100,
        "tenant": "acme",
        "use_case_id": 12,
        "cost": 500,
        "limits": _limits(),
    }
    fields.update(changes)
    return Ticket(**fields)


def real_counters(client: valkey.Valkey) -> dict[str, int]:
    """The windows counted now (the scheduler's clock); tests here stay within them."""
    total: dict[str, int] = {}
    for limit_id, *_ in LIMITS:
        found: Any = client.keys(keys.KEY_PREFIX + f"rl:{limit_id}:*")
        values: Any = [client.get(key) for key in found]
        total[limit_id] = sum(int(value or 0) for value in values)
    return total


async def _held(scheduler: Scheduler, url: str) -> None:
    """Fresh metrics for R1 and one request holding its only slot."""
    client = avalkey.Valkey.from_url(url)
    try:
        await write_fresh_fleet(client, [R1])
    finally:
        await client.aclose()
    await scheduler.acquire(_ticket("holder", tenant="other"))


async def test_a_request_shed_at_its_queue_timeout_is_refunded(valkey_client, valkey_url):
    async with running_schedulers(valkey_url) as (scheduler,):
        await _held(scheduler, valkey_url)
        before = real_counters(valkey_client)

        with pytest.raises(QueueTimeout):
            await scheduler.acquire(_ticket("shed", queue_timeout_s=0.3))

        assert real_counters(valkey_client) == before
        assert tenant_finish(valkey_client) == 0


async def test_a_request_refused_for_a_full_queue_is_not_charged(valkey_client, valkey_url):
    async with running_schedulers(valkey_url) as (scheduler,):
        await _held(scheduler, valkey_url)
        before = real_counters(valkey_client)

        with pytest.raises(QueueFull):
            await scheduler.acquire(_ticket("full", max_queue_length=0))

        assert real_counters(valkey_client) == before


async def test_a_client_that_goes_away_while_queued_is_refunded(valkey_client, valkey_url):
    async with running_schedulers(valkey_url) as (scheduler,):
        await _held(scheduler, valkey_url)
        before = real_counters(valkey_client)
        waiting = asyncio.create_task(scheduler.acquire(_ticket("gone")))
        await eventually(lambda: valkey_client.zcard(keys.queue(MODEL)) == 1)
        assert real_counters(valkey_client) != before  # charged while it waited

        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

        await eventually(lambda: valkey_client.zcard(keys.queue(MODEL)) == 0)
        await eventually(lambda: real_counters(valkey_client) == before)
        assert tenant_finish(valkey_client) == 0


def test_a_request_leaves_no_charge_record_behind_once_it_ends(lua):
    """The charge kept for a refund lives as long as the request: gone after a release, a
    cancel or a drop; a reaped lease's is kept only for a while."""
    lua.fleet(T0, (R1, 0))
    assert lua.acquire(T0, "served", limits=LIMITS, replicas=[(R1, 2)])[0] == 1
    assert lua.client.exists(keys.pool_prefix(MODEL) + "rf:served") == 1
    lua.release(T0 + 1, "served")
    saturate(lua)
    assert lua.acquire(T0, "cancelled", limits=LIMITS)[0] == 0
    lua.cancel(T0 + 1, "cancelled")
    assert lua.acquire(T0, "late", deadline=T0 + 10, limits=LIMITS)[0] == 0
    lua("reap", T0 + 10)

    assert (
        lua.client.exists(
            *(keys.pool_prefix(MODEL) + f"rf:{n}" for n in ("served", "cancelled", "late"))
        )
        == 0
    )

    assert [int(v) for v in lua("reap", T0 + 30_000)] == [1, 0, 0]  # the holder's lease
    assert 0 < lua.client.pttl(keys.pool_prefix(MODEL) + "rf:holder") <= 3_600_000


class _Unreached(Exception):
    """Stands for the gateway's ReplicaUnreachable: the grant was never used."""


async def test_a_grant_left_with_a_refund_exception_is_refunded_and_frees_its_slot(
    valkey_client, valkey_url
):
    """GIVEN a granted request whose replica turns out unreachable
    WHEN its keep-alive block ends with one of ``refund_on``'s exceptions
    THEN its rate-limit charge is given back, its slot is free again, and the hold-time
    estimate the Retry-After uses is not lowered by a hold that served nothing; any other
    exit is a normal release that keeps the charge."""
    async with running_schedulers(valkey_url) as (scheduler,):
        client = avalkey.Valkey.from_url(valkey_url)
        try:
            await write_fresh_fleet(client, [R1])
        finally:
            await client.aclose()
        valkey_client.hset(keys.service(MODEL), "hold_ms", "2000")
        before = real_counters(valkey_client)

        grant = await scheduler.acquire(_ticket("unreached"))
        assert real_counters(valkey_client) != before
        with pytest.raises(_Unreached):
            async with scheduler.keep_alive(grant, refund_on=(_Unreached,)):
                raise _Unreached

        assert real_counters(valkey_client) == before
        assert valkey_client.hlen(keys.in_flight(MODEL)) == 0
        assert float(valkey_client.hget(keys.service(MODEL), "hold_ms") or 0) == 2000

        grant = await scheduler.acquire(_ticket("failed"))  # R1's one slot is free again
        with pytest.raises(RuntimeError):
            async with scheduler.keep_alive(grant, refund_on=(_Unreached,)):
                raise RuntimeError("the replica answered, then something broke")
        assert real_counters(valkey_client) != before  # served: charged
