"""The Scheduler's Python API against the real Valkey: several schedulers (as separate
gateway processes would) share one capacity, queue, and hand grants to each other."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import replace
from typing import Any

import orjson
import pytest
import valkey.asyncio as avalkey

from gateway.policy import Principal, parse_snapshot
from gateway.scheduling import (
    UNCLASSIFIED,
    MaxConcurrent,
    QueueFull,
    QueueLost,
    QueueTimeout,
    Ticket,
    keys,
    retry_after_s,
    saturated_entry,
    ticket_for,
    wall_ms,
    write_fleet,
)
from tests.gateway.scheduling.conftest import (
    MODEL,
    R1,
    R2,
    eventually,
    running_schedulers,
    write_fresh_fleet,
)
from tests.gateway.scheduling.test_scheduling_lua import jain


def ticket(request_id: str, **overrides) -> Ticket:
    base = Ticket(
        request_id=request_id,
        model=MODEL,
        replicas=((R1, 1),),
        rank=1,
        priority_class="prod",
        queue_timeout_s=5.0,
        max_queue_length=1000,
        tenant="acme",
        use_case_id=1,
        cost=100,
        vllm_priority=3,
    )
    return replace(base, **overrides)


async def queued(client: avalkey.Valkey, count: int) -> None:
    await eventually(lambda: _zcard_is(client, count), message=f"{count} waiters never showed up")


async def _zcard_is(client: avalkey.Valkey, count: int) -> bool:
    return int(await client.zcard(keys.queue(MODEL))) == count


async def leaked(client: Any) -> dict[str, object]:
    """Everything that would be a leak once every request has finished."""
    return {
        "in_flight": await client.hgetall(keys.in_flight(MODEL)),
        "leases": await client.zcard(keys.leases(MODEL)),
        "queue": await client.zcard(keys.queue(MODEL)),
        "waiters": await client.keys(keys.waiter("*", "*")),
        "lease_infos": await client.keys(keys.lease("*", "*")),
        "grants": await client.keys(keys.grant("*", "*")),
        "queue_lengths": await client.keys(keys.queue_length(MODEL, "*")),
        "concurrency": await client.keys(keys.concurrency("*", "*")),
    }


async def write_hash(client: Any, key: str, mapping: dict[str, str]) -> None:
    await client.hset(key, mapping=mapping)


NOTHING = {
    "in_flight": {},
    "leases": 0,
    "queue": 0,
    "waiters": [],
    "lease_infos": [],
    "grants": [],
    "queue_lengths": [],
    "concurrency": [],
}


@pytest.fixture
def client_url(valkey_client, valkey_url) -> str:
    return valkey_url  # valkey_client flushed the database first


async def test_a_grant_at_once_carries_the_replica_and_the_vllm_priority(client_url):
    async with running_schedulers(client_url) as [gateway]:
        client = gateway._client
        await write_fresh_fleet(client, [R1])

        grant = await gateway.acquire(ticket("req-1", max_concurrent=2))

        assert (grant.replica, grant.vllm_priority, grant.model) == (R1, 3, MODEL)
        assert grant.request_id == "req-1"
        assert grant.lease_id.startswith("req-1.")
        await gateway.release(grant)
        assert await leaked(client) == NOTHING


async def test_a_waiter_on_another_gateway_is_granted_through_its_channel(client_url):
    """GIVEN gateway A holds the only slot and gateway B's request waits (its fallback poll
    set to 5 s), WHEN A releases, THEN B's waiter is granted well before any poll."""
    async with running_schedulers(client_url, 2, poll_interval_s=5.0) as [a, b]:
        await write_fresh_fleet(a._client, [R1])
        held = await a.acquire(ticket("a"))
        waiting = asyncio.create_task(b.acquire(ticket("b")))
        await queued(a._client, 1)

        released_at = time.monotonic()
        await a.release(held)
        grant = await waiting

        assert time.monotonic() - released_at < 1.0
        assert grant.replica == R1
        assert grant.queued_ms > 0
        await b.release(grant)


async def test_a_lost_grant_message_is_caught_by_the_fallback_poll(client_url):
    """GIVEN a waiter, WHEN Valkey drops the gateway's pub/sub connection just before the
    grant is published, THEN the waiter still gets its grant (poll every 50 ms), and later
    grants arrive through the resubscribed channel."""
    async with running_schedulers(client_url, 2, poll_interval_s=0.05) as [a, b]:
        client = a._client
        await write_fresh_fleet(client, [R1])
        held = await a.acquire(ticket("a"))
        waiting = asyncio.create_task(b.acquire(ticket("b")))
        await queued(client, 1)

        await client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        await a.release(held)
        grant = await asyncio.wait_for(waiting, 2.0)

        again = asyncio.create_task(b.acquire(ticket("c")))
        await queued(client, 1)
        await b.release(grant)
        await b.release(await asyncio.wait_for(again, 2.0))
        assert await leaked(client) == NOTHING


async def test_schedulers_sharing_one_valkey_never_exceed_the_caps(client_url):
    """GIVEN three gateways and two replicas with caps 2 and 3, WHEN 150 requests with short
    random holds go through them at once, THEN no replica ever has more in flight than its
    cap, the whole capacity gets used, and nothing is left held at the end."""
    caps = {R1: 2, R2: 3}
    in_use: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    peak_total = 0
    rng = random.Random(7)

    async with running_schedulers(client_url, 3, poll_interval_s=0.05) as gateways:
        await write_fresh_fleet(gateways[0]._client, list(caps))

        async def one(n: int) -> None:
            nonlocal peak_total
            gateway = gateways[n % 3]
            grant = await gateway.acquire(
                ticket(f"r{n}", replicas=tuple(caps.items()), tenant=f"t{n % 4}")
            )
            in_use[grant.replica] += 1
            peak[grant.replica] = max(peak[grant.replica], in_use[grant.replica])
            peak_total = max(peak_total, sum(in_use.values()))
            await asyncio.sleep(rng.random() * 0.003)
            in_use[grant.replica] -= 1
            await gateway.release(grant)

        await asyncio.gather(*(one(n) for n in range(150)))

        assert all(peak[replica] <= cap for replica, cap in caps.items()), peak
        assert peak_total == 5
        assert await leaked(gateways[0]._client) == NOTHING


async def test_the_top_rank_is_granted_first_then_the_rest_in_order(client_url):
    """GIVEN capacity 1 busy, 100 low-rank waiters, then 1 top-rank waiter, WHEN the slot is
    released and every grant releases in turn, THEN the top-rank request goes first and the
    low-rank ones follow in arrival order."""
    order: list[str] = []
    async with running_schedulers(client_url, 2) as [a, b]:
        client = a._client
        await write_fresh_fleet(client, [R1])
        holder = await a.acquire(ticket("holder"))

        async def one(gateway, request_id: str, rank: int) -> None:
            grant = await gateway.acquire(ticket(request_id, rank=rank, priority_class=str(rank)))
            order.append(request_id)
            await gateway.release(grant)

        tasks = []
        for n in range(100):
            tasks.append(asyncio.create_task(one((a, b)[n % 2], f"low-{n:03}", 5)))
            await queued(client, n + 1)  # arrival order is what FIFO within a tenant means
        tasks.append(asyncio.create_task(one(b, "top", 0)))
        await queued(client, 101)

        await a.release(holder)
        await asyncio.gather(*tasks)

        assert order == ["top"] + [f"low-{n:03}" for n in range(100)]


async def test_a_heavy_tenant_does_not_starve_a_light_one(client_url):
    """GIVEN one slot, tenant A queueing 8 requests of 28,000 tokens and tenant B 300 of 200
    tokens at the same rank, WHEN they are served in turn, THEN over the first 282 grants the
    tokens served per tenant are equal within Jain's index 0.99, B's first request goes
    within the first two grants, and never do two of A's run back to back while B waits."""
    served: list[tuple[str, int]] = []
    async with running_schedulers(client_url) as [gateway]:
        client = gateway._client
        await write_fresh_fleet(client, [R1])
        holder = await gateway.acquire(ticket("holder", tenant="warmup"))

        async def one(tenant: str, n: int, cost: int) -> None:
            grant = await gateway.acquire(ticket(f"{tenant}-{n}", tenant=tenant, cost=cost))
            served.append((tenant, cost))
            await gateway.release(grant)

        tasks = [asyncio.create_task(one("A", n, 28_000)) for n in range(8)]
        tasks += [asyncio.create_task(one("B", n, 200)) for n in range(300)]
        await queued(client, 308)
        await gateway.release(holder)
        await asyncio.gather(*tasks)

    window = served[:282]
    tokens = [sum(cost for tenant, cost in window if tenant == t) for t in "AB"]
    assert jain(tokens) > 0.99, tokens
    tenants = [tenant for tenant, _ in served]
    assert tenants.index("B") <= 1
    b_done = len(tenants) - tenants[::-1].index("B")
    assert "AA" not in "".join(tenants[:b_done])


async def test_a_full_queue_refuses_with_a_retry_after_from_the_pool(client_url):
    async with running_schedulers(client_url) as [gateway]:
        client = gateway._client
        await write_fresh_fleet(client, [R1])
        # Some history: grants held 2 s on average.
        await write_hash(client, keys.service(MODEL), {"hold_ms": "2000"})
        holder = await gateway.acquire(ticket("holder"))
        waiters = [
            asyncio.create_task(gateway.acquire(ticket(f"w{n}", max_queue_length=2)))
            for n in range(2)
        ]
        await queued(client, 2)

        with pytest.raises(QueueFull) as refused:
            await gateway.acquire(ticket("w2", max_queue_length=2))

        # Two ahead and one slot turning over every 2 s: about 6 s.
        assert refused.value.retry_after_s == 6
        assert (refused.value.status, refused.value.code) == (503, "queue_full")
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        await gateway.release(holder)
        # A cancelled waiter's cancel goes out from a background task: the release may reach
        # Valkey first and grant it, and the cancel then gives that grant back.
        await eventually(
            lambda: _nothing_leaked(client), message="a cancelled waiter's grant was kept"
        )


async def _nothing_leaked(client: Any) -> bool:
    return await leaked(client) == NOTHING


def test_retry_after_follows_the_depth_and_the_service_rate():
    assert retry_after_s(ahead=9, hold_ms=1_000, in_flight=10, fallback_s=30) == 1
    assert retry_after_s(ahead=99, hold_ms=1_000, in_flight=10, fallback_s=30) == 10
    assert retry_after_s(ahead=99, hold_ms=4_000, in_flight=10, fallback_s=30) == 40
    assert retry_after_s(ahead=5, hold_ms=-1, in_flight=0, fallback_s=12.5) == 13


def test_retry_after_counts_what_better_ranks_keep_taking_of_the_pool():
    """The pool serves 10/s; better ranks arriving at 8/s leave 2/s to this class: the 99
    ahead (better ranks included) and this one take 50 s, not 10 s."""
    plain = {"ahead": 99, "hold_ms": 1_000, "in_flight": 10, "fallback_s": 30}
    assert retry_after_s(**plain, higher_rate_per_s=0) == 10
    assert retry_after_s(**plain, higher_rate_per_s=8) == 50
    # Better ranks arriving as fast as the pool serves, or faster: the class is assumed to
    # keep 5 % of it (20 × the plain estimate), never "never".
    assert retry_after_s(**plain, higher_rate_per_s=10) == 200
    assert retry_after_s(**plain, higher_rate_per_s=500) == 200
    # Never less than the plain estimate, which already waits for everyone ahead.
    assert retry_after_s(**plain, higher_rate_per_s=-3) == 10
    assert retry_after_s(ahead=10**6, hold_ms=10_000, in_flight=1, fallback_s=1) == 3600
    assert retry_after_s(ahead=5, hold_ms=-1, in_flight=0, fallback_s=7, higher_rate_per_s=9) == 7


async def test_a_lower_class_refused_while_better_ranks_keep_arriving_waits_for_them_too(
    client_url,
):
    """GIVEN one slot turning over every 2 s, 4 prod requests (rank 0) enqueued in the last
    seconds and a dev queue (rank 5) of length 1 already full, WHEN another dev request is
    refused, THEN its Retry-After counts the 5 ahead of it and prod's arrivals (0.4/s of the
    pool's 0.5/s): 60 s, where the queue depth alone would say 12 s."""
    now = (wall_ms() // 10_000) * 10_000 + 5_000  # mid-window, however long the test takes
    async with running_schedulers(client_url, clock=lambda: now) as [gateway]:
        client = gateway._client
        await write_fresh_fleet(client, [R1])
        await write_hash(client, keys.service(MODEL), {"hold_ms": "2000"})
        holder = await gateway.acquire(ticket("holder"))
        prod = {"rank": 0, "priority_class": "prod"}
        dev = {"rank": 5, "priority_class": "dev", "max_queue_length": 1}
        waiters = [asyncio.create_task(gateway.acquire(ticket(f"p{n}", **prod))) for n in range(4)]
        waiters.append(asyncio.create_task(gateway.acquire(ticket("d0", **dev))))
        await queued(client, 5)

        with pytest.raises(QueueFull) as refused:
            await gateway.acquire(ticket("d1", **dev))

        assert refused.value.retry_after_s == 60
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        await gateway.release(holder)
        await eventually(  # as in the test above: a cancel may give a raced grant back
            lambda: _nothing_leaked(client), message="a cancelled waiter's grant was kept"
        )


async def test_a_queue_timeout_removes_the_waiter(client_url):
    async with running_schedulers(client_url) as [gateway]:
        client = gateway._client
        await write_fresh_fleet(client, [R1])
        holder = await gateway.acquire(ticket("holder"))
        started = time.monotonic()

        with pytest.raises(QueueTimeout) as timed_out:
            await gateway.acquire(ticket("late", queue_timeout_s=0.3))

        assert 0.3 <= time.monotonic() - started < 1.0
        assert timed_out.value.retry_after_s >= 1
        assert await client.zcard(keys.queue(MODEL)) == 0
        assert await client.keys(keys.waiter("*", "*")) == []
        await gateway.release(holder)
        assert await leaked(client) == NOTHING


async def test_a_waiter_whose_place_is_lost_is_told_at_once_not_at_its_timeout(client_url):
    """GIVEN a request waiting (queue timeout 60 s) behind one holding the only replica
    WHEN its place disappears without a grant — the Valkey restarted empty (FLUSHDB here; a
    failover to a replica that never had the place looks the same)
    THEN it is refused as queue_lost at the next poll, with a short Retry-After, instead of
    waiting out the 60 s (the test's own bound, 20 s, would fail it as a timeout)."""
    async with running_schedulers(client_url) as [gateway]:
        client = gateway._client
        await write_fresh_fleet(client, [R1])
        await gateway.acquire(ticket("holder"))
        waiting = asyncio.create_task(gateway.acquire(ticket("late", queue_timeout_s=60.0)))
        await queued(client, 1)

        await client.flushdb()

        with pytest.raises(QueueLost) as lost:
            await asyncio.wait_for(waiting, timeout=20)
        assert (lost.value.code, lost.value.retry_after_s) == ("queue_lost", 1)
        assert isinstance(lost.value, QueueTimeout)  # answered as the 503 it always was


async def test_max_concurrent_per_use_case(client_url):
    async with running_schedulers(client_url) as [gateway]:
        client = gateway._client
        await write_fresh_fleet(client, [R1])
        limited = {"use_case_id": 42, "max_concurrent": 2, "replicas": ((R1, 10),)}
        first = await gateway.acquire(ticket("c1", **limited))
        second = await gateway.acquire(ticket("c2", **limited))

        with pytest.raises(MaxConcurrent) as refused:
            await gateway.acquire(ticket("c3", **limited))
        assert refused.value.status == 429
        assert refused.value.retry_after_s >= 1
        other = await gateway.acquire(ticket("other-use-case", **{**limited, "use_case_id": 43}))

        await gateway.release(first)
        third = await gateway.acquire(ticket("c4", **limited))
        for grant in (second, third, other):
            await gateway.release(grant)
        assert await leaked(client) == NOTHING


async def test_a_cancelled_waiter_leaves_nothing_behind(client_url):
    async with running_schedulers(client_url) as [gateway]:
        client = gateway._client
        await write_fresh_fleet(client, [R1])
        holder = await gateway.acquire(ticket("holder", use_case_id=5, max_concurrent=3))
        waiter = asyncio.create_task(gateway.acquire(ticket("w", use_case_id=5, max_concurrent=3)))
        await queued(client, 1)

        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

        # The cancel goes out on the pipe without being awaited (the cancelled task cannot
        # wait): it lands behind the acquire, but may come after a read on another connection.
        await queued(client, 0)
        await gateway.release(holder)
        await eventually(lambda: _nothing_leaked(client), message="the cancelled waiter leaked")


async def test_a_grant_racing_a_cancel_is_released(client_url):
    """GIVEN a waiter, WHEN its grant lands in Valkey and the waiting task is cancelled before
    it runs again (many times, at varying moments), THEN no capacity leaks: every grant that
    raced in was released by the cancel."""
    async with running_schedulers(client_url, 2) as [a, b]:
        client = a._client
        await write_fresh_fleet(client, [R1])
        rng = random.Random(3)
        outcomes: Counter[str] = Counter()
        for n in range(40):
            holder = await a.acquire(ticket(f"h{n}", use_case_id=9, max_concurrent=5))
            waiter = asyncio.create_task(
                b.acquire(ticket(f"w{n}", use_case_id=9, max_concurrent=5))
            )
            await queued(client, 1)
            if n % 2 == 0:
                await a.release(holder)  # the grant is in Valkey now; cancel right behind it
            else:
                releasing = asyncio.create_task(a.release(holder))
                await asyncio.sleep(rng.random() * 0.002)  # explore interleavings
            waiter.cancel()
            try:
                grant = await waiter
            except asyncio.CancelledError:
                outcomes["cancelled"] += 1
            else:
                outcomes["granted first"] += 1
                await b.release(grant)
            if n % 2:
                await releasing
            assert await leaked(client) == NOTHING, n
        assert outcomes["cancelled"] >= 20, outcomes


async def test_a_bug_in_one_heartbeat_or_reaper_pass_does_not_end_them(client_url, caplog):
    """GIVEN a scheduler whose heartbeat and reaper passes raise a bug's exception (not a
    Valkey failure) once each
    WHEN its background task meets them
    THEN it logs them with their traceback and goes on: the next passes run (an expired lease
    is reaped, the heartbeat is renewed), where before the task ended for good."""
    async with running_schedulers(client_url, reap_interval_s=0.05) as [gateway]:
        client = gateway._client
        await write_fresh_fleet(client, [R1])
        faults = {"heartbeat": 1, "reap": 1}
        for name in faults:
            real = getattr(gateway, name)

            async def faulty(*args: Any, _real: Any = real, _name: str = name) -> Any:
                if faults[_name]:
                    faults[_name] -= 1
                    raise AttributeError(f"a bug in {_name}")
                return await _real(*args)

            setattr(gateway, name, faulty)
        await eventually(lambda: not any(faults.values()), message="the faults never ran")
        held = await gateway.acquire(ticket("held"))
        await client.zadd(keys.leases(MODEL), {held.lease_id: 0})
        await eventually(
            lambda: _zcard_of(client, keys.leases(MODEL), 0),
            message="the reaper stopped after the bug",
        )
        assert "scheduler_heartbeat_crashed" in caplog.text
        assert "scheduler_reap_crashed" in caplog.text


async def _zcard_of(client: Any, key: str, count: int) -> bool:
    return int(await client.zcard(key)) == count


async def test_a_crashed_gateways_leases_are_reaped_and_the_capacity_returns(client_url):
    """GIVEN gateway A holds the only slot with a 400 ms lease and dies without releasing,
    WHEN gateway B's request waits for that slot, THEN B's reaper returns the capacity once
    the lease expires, and B is granted within about lease_ms."""
    options: dict[str, Any] = {"lease_ms": 400, "reap_interval_s": 0.05}
    async with running_schedulers(client_url, **options) as [b]:
        client = b._client
        await write_fresh_fleet(client, [R1])
        async with running_schedulers(client_url, **options) as [a]:
            await a.acquire(ticket("held-by-a-dead-gateway"))
            crashed_at = time.monotonic()
        # A is gone (its client closed, no release, no renewals); its lease is still there.
        assert await client.zcard(keys.leases(MODEL)) == 1

        grant = await b.acquire(ticket("b"))

        waited = time.monotonic() - crashed_at
        assert 0.3 < waited < 0.4 + 0.3, waited
        await b.release(grant)
        assert await leaked(client) == NOTHING


async def kill(scheduler: Any) -> None:
    """As if its process died: no heartbeat, no renewals, no listener from now on (its
    requests still waiting go on polling, as a process frozen and not yet gone would)."""
    for task in scheduler._tasks:
        task.cancel()
    await asyncio.gather(*scheduler._tasks, return_exceptions=True)


async def test_a_dead_gateways_waiters_are_never_granted_and_its_capacity_returns_in_seconds(
    client_url,
):
    """GIVEN gateway A holding the only slot on a 30 s lease, with a request of its own
    queued before gateway B's, WHEN A dies (heartbeat every 60 ms, expiring after 300 ms),
    THEN B is granted within about the heartbeat — not the 30 s lease — and A's waiter is
    never granted (it times out in the queue it was dropped from)."""
    options: dict[str, Any] = {"lease_ms": 30_000, "reap_interval_s": 0.05, "heartbeat_ms": 300}
    async with running_schedulers(client_url, 2, **options) as [a, b]:
        client = b._client
        await write_fresh_fleet(client, [R1])
        await a.acquire(ticket("held-by-a"))
        # Its first request joined the pool: its heartbeat is in the pool's slot.
        assert await client.zscore(keys.gateways(MODEL), "gw-0") > wall_ms()
        a_waiter = asyncio.create_task(a.acquire(ticket("a-waiter", queue_timeout_s=2.0)))
        await queued(client, 1)
        b_waiter = asyncio.create_task(b.acquire(ticket("b-waiter")))
        await queued(client, 2)

        await kill(a)
        died_at = time.monotonic()
        grant = await b_waiter

        waited = time.monotonic() - died_at
        assert waited < 1.5, waited
        assert not a_waiter.done()
        with pytest.raises(QueueTimeout):
            await a_waiter
        assert await client.zscore(keys.gateways(MODEL), "gw-0") is None
        await b.release(grant)
        assert await leaked(client) == NOTHING


async def test_hold_renews_a_long_request_and_always_releases(client_url):
    options: dict[str, Any] = {"lease_ms": 300, "reap_interval_s": 0.05}
    async with running_schedulers(client_url, **options) as [gateway]:
        client = gateway._client
        await write_fresh_fleet(client, [R1])

        async with gateway.hold(ticket("long")) as grant:
            await asyncio.sleep(0.8)  # the request itself: well past lease_ms
            assert await client.zscore(keys.leases(MODEL), grant.lease_id) is not None
            assert (await leaked(client))["in_flight"] == {R1.encode(): b"1"}

        with pytest.raises(RuntimeError):
            async with gateway.hold(ticket("fails")):
                raise RuntimeError("upstream broke")
        assert await leaked(client) == NOTHING


async def test_renewal_reports_a_lost_lease(client_url):
    # The default lease: its background renewals (every 10 s) stay out of the way.
    async with running_schedulers(client_url) as [gateway]:
        client = gateway._client
        await write_fresh_fleet(client, [R1])
        grant = await gateway.acquire(ticket("r"))
        async with gateway.keep_alive(grant):
            assert await gateway.renew_held() == 0  # renewed, none lost
            await client.zadd(keys.leases(MODEL), {grant.lease_id: 0})  # as if long expired
            assert await gateway.reap() == (1, 0, 0)
            assert await gateway.renew_held() == 1  # reaped: reported lost, and forgotten
            assert await gateway.renew_held() == 0


async def test_unreachable_stale_or_busy_replicas_hold_requests_until_one_drains(client_url):
    """GIVEN a replica written as unreachable, then idle but stale, then fresh with vLLM's own
    queue at the threshold, WHEN the watcher writes it drained and pumps, THEN the waiters
    queued meanwhile are granted, and not before."""
    async with running_schedulers(client_url, stale_ms=500, waiting_threshold=3) as [gateway]:
        client = gateway._client
        pool = {"replicas": ((R1, 4),)}
        phases = [
            saturated_entry(scraped_at_ms=wall_ms()),
            f"0|0|0.1|{wall_ms() - 600}",  # idle, but scraped 600 ms ago
            f"3|8|0.9|{wall_ms()}",  # fresh, with 3 waiting in vLLM
        ]
        waiters = []
        for n, entry in enumerate(phases):
            await write_fleet(client, MODEL, {R1: entry})
            waiters.append(asyncio.create_task(gateway.acquire(ticket(f"w{n}", **pool))))
            await queued(client, n + 1)
            assert await gateway.pump(MODEL) == 0

        await write_fresh_fleet(client, [R1], waiting=0)
        assert await gateway.pump(MODEL) == 3

        for grant in await asyncio.gather(*waiters):
            await gateway.release(grant)
        assert await leaked(client) == NOTHING


async def test_prefix_affinity_prefers_its_replica_and_falls_back_when_full(client_url):
    async with running_schedulers(client_url) as [gateway]:
        client = gateway._client
        await write_fresh_fleet(client, [R1, R2])
        pool = ((R1, 2), (R2, 2))
        first = await gateway.acquire(ticket("p1", replicas=pool, prefix_hash="sys-prompt"))
        other = await gateway.acquire(ticket("x", replicas=pool))
        assert other.replica != first.replica  # least in flight
        second = await gateway.acquire(ticket("p2", replicas=pool, prefix_hash="sys-prompt"))
        assert second.replica == first.replica  # affinity, while it has room

        third = await gateway.acquire(ticket("p3", replicas=pool, prefix_hash="sys-prompt"))
        assert third.replica == other.replica  # its replica is full: fall back

        for grant in (first, other, second, third):
            await gateway.release(grant)


async def test_acquire_before_start_is_an_error(client_url):
    from gateway.scheduling import Scheduler

    client = avalkey.Valkey.from_url(client_url)
    try:
        with pytest.raises(RuntimeError):
            await Scheduler(client).acquire(ticket("r"))
    finally:
        await client.aclose()


def test_ticket_for_takes_class_limits_and_caps_from_the_policy():
    policy = parse_snapshot(
        orjson.dumps(
            {
                "schema": 1,
                "version": 1,
                "published_at": 0.0,
                "models": {
                    "llama": {
                        "served_name": "llama",
                        "capabilities": ["chat"],
                        "replicas": [R1, R2],
                        "timeout_s": 30.0,
                        "max_tokens": None,
                        "max_in_flight_per_replica": 16,
                    }
                },
                "keys": {},
                "use_cases": {
                    "12": {
                        "tenant": "acme",
                        "slug": "bot",
                        "limits": {
                            "requests_per_minute": None,
                            "tokens_per_minute": None,
                            "tokens_per_day": None,
                            "max_concurrent": 6,
                        },
                        "guardrails": [],
                    }
                },
                "priority_classes": {
                    "prod": {
                        "rank": 1,
                        "vllm_priority": -10,
                        "queue_timeout_s": 20.0,
                        "max_queue_length": 50,
                    },
                    "dev": {
                        "rank": 4,
                        "vllm_priority": 40,
                        "queue_timeout_s": 5.0,
                        "max_queue_length": 10,
                    },
                },
            }
        )
    )
    principal = Principal(
        key_id=1,
        key_prefix="sk-sy-x",
        tenant="acme",
        tenant_id=1,
        environment="prod",
        use_case="bot",
        use_case_id=12,
        namespace="prod",
        models=frozenset({"llama"}),
        expires_at=None,
        priority_class="prod",
    )
    model = policy.models["llama"]

    made = ticket_for(policy, principal, model, request_id="abc", cost=900, prefix_hash="p")

    assert (made.rank, made.priority_class, made.vllm_priority) == (1, "prod", -10)
    assert (made.queue_timeout_s, made.max_queue_length, made.max_concurrent) == (20.0, 50, 6)
    assert made.replicas == ((R1, 16), (R2, 16))
    assert (made.cost, made.tenant, made.use_case_id) == (900, "acme", 12)

    unclassified = ticket_for(
        policy, replace(principal, priority_class=None), model, request_id="d", cost=0
    )
    assert (unclassified.priority_class, unclassified.rank) == (UNCLASSIFIED, 5)
    assert (unclassified.vllm_priority, unclassified.cost) == (41, 1)
