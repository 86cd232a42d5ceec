"""The scheduling scripts called directly (acquire, release, pump, cancel, reap, renew), with
time driven through now_ms."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import pytest

from gateway.scheduling import keys
from tests.gateway.scheduling.conftest import FOREVER_MS, MODEL, R1, R2, Lua

T0 = 1_800_000_000_000


@pytest.fixture(autouse=True)
def live_gateways(lua: Lua) -> None:
    """The gateways these tests enqueue for are running: their heartbeats are fresh (a pump
    drops the waiters of a gateway without one)."""
    for gateway in ("gw-a", "gw-b"):
        lua.heartbeat(gateway, FOREVER_MS)


def jain(values: Sequence[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def busy(lua: Lua, now: int = T0, request_id: str = "holder", **options) -> None:
    """Fresh metrics for R1 and one request holding its only slot."""
    lua.fleet(now, (R1, 0))
    assert lua.acquire(now, request_id, **options) == [1, R1]


def holder_of(lua: Lua) -> str:
    members: Any = lua.client.zrange(keys.leases(MODEL), 0, -1)
    (member,) = members
    return member.decode()


def test_a_request_is_granted_at_once_when_a_replica_has_room(lua):
    lua.fleet(T0, (R1, 0))

    assert lua.acquire(T0, "r1", lease_ms=5_000) == [1, R1]

    assert lua.in_flight() == {R1: 1}
    assert lua.client.zscore(keys.leases(MODEL), "r1") == T0 + 5_000
    assert lua.client.hget(keys.lease("r1", MODEL), "replica") == R1.encode()
    assert lua.queue() == []


def test_stale_or_missing_metrics_count_as_saturated(lua):
    assert lua.acquire(T0, "no-metrics")[0] == 0
    lua.fleet(T0 - 1_001, (R1, 0))
    assert lua.acquire(T0, "stale", stale_ms=1_000)[0] == 0
    assert lua.in_flight() == {}
    assert lua.queue() == ["no-metrics", "stale"]


def test_a_replica_whose_own_queue_reached_the_threshold_is_saturated(lua):
    lua.fleet(T0, (R1, 3))
    assert lua.acquire(T0, "r1", threshold=3)[0] == 0
    lua.fleet(T0, (R1, 2))
    assert lua.acquire(T0, "r2", threshold=3, rank=0) == [1, R1]


def test_a_draining_replica_is_pumped_to_its_waiters(lua):
    """GIVEN waiters queued behind a saturated replica, WHEN the watcher writes it drained and
    calls pump, THEN waiters are granted up to the cap and told on their gateway's channel."""
    listener = lua.client.pubsub(ignore_subscribe_messages=True)
    listener.subscribe("sy:gw:gw-b")
    lua.fleet(T0, (R1, 5))
    for n in range(3):
        assert lua.acquire(T0, f"w{n}", gateway="gw-b", replicas=[(R1, 2)])[0] == 0

    lua.fleet(T0 + 250, (R1, 0))
    assert lua("pump", T0 + 250, MODEL) == 2

    assert lua.queue() == ["w2"]
    assert lua.client.get(keys.grant("w0", MODEL)) == R1.encode()
    messages = []
    for _ in range(10):  # the subscribe confirmation comes first, and reads as None
        message = listener.get_message(timeout=1.0)
        if message is not None:
            messages.append(message["data"])
        if len(messages) == 2:
            break
    assert messages == [f"w0 {R1}".encode(), f"w1 {R1}".encode()]
    listener.close()


def test_the_top_rank_is_granted_first_under_overload(lua):
    """GIVEN capacity 1 busy and 100 low-rank waiters, WHEN a top-rank request arrives and the
    holder releases, THEN the top-rank request is granted before every earlier waiter."""
    busy(lua)
    for n in range(100):
        assert lua.acquire(T0 + n, f"low-{n}", rank=5, priority_class="dev")[0] == 0
    assert lua.acquire(T0 + 200, "top", rank=0, priority_class="prod-dr")[0] == 0

    assert lua.release(T0 + 300, "holder") == [1, 1, 0]

    assert holder_of(lua) == "top"
    assert lua.release(T0 + 400, "top") == [1, 1, 0]
    assert holder_of(lua) == "low-0"


def test_a_better_rank_waiting_sends_newcomers_of_a_worse_rank_to_the_queue(lua):
    lua.fleet(T0, (R1, 0))
    assert lua.acquire(T0, "a", replicas=[(R1, 1)]) == [1, R1]
    assert lua.acquire(T0, "b", rank=0, replicas=[(R1, 1)])[0] == 0
    # Room appears (a bigger cap), but "b" waits at a better rank: "c" queues behind it and
    # acquire's own pump grants "b".
    assert lua.acquire(T0, "c", rank=3, replicas=[(R1, 2)])[0] == 0
    assert lua.queue() == ["c"]
    assert lua.client.get(keys.grant("b", MODEL)) == R1.encode()


def test_fair_queueing_shares_tokens_between_a_heavy_and_a_light_tenant(lua):
    """GIVEN one slot, tenant A queueing 28,000-token requests and tenant B 200-token ones at
    the same rank, WHEN the slot serves 600 requests in turn, THEN the tokens served are
    shared almost equally (Jain's index over both tenants) and B never waits behind more than
    one of A's requests."""
    busy(lua, tenant="warmup", cost=1)
    cost = {"A": 28_000, "B": 200}
    for n in range(25):
        assert lua.acquire(T0 + 1, f"A-{n:04}", tenant="A", cost=cost["A"])[0] == 0
    for n in range(1_000):
        assert lua.acquire(T0 + 2, f"B-{n:04}", tenant="B", cost=cost["B"], max_queue=5_000)[0] == 0

    served = []
    current = "holder"
    for step in range(600):
        assert lua.release(T0 + 10 + step, current) == [1, 1, 0]
        current = holder_of(lua)
        served.append(current[0])

    tokens = [sum(cost[t] for t in served if t == tenant) for tenant in "AB"]
    assert jain(tokens) > 0.99, tokens
    assert served.index("B") <= 1
    assert all(not (x == y == "A") for x, y in pairwise(served))


def test_a_full_class_queue_refuses_while_another_class_still_queues(lua):
    busy(lua)
    for n in range(2):
        assert lua.acquire(T0, f"q{n}", priority_class="dev", rank=5, max_queue=2)[0] == 0

    refused = lua.acquire(T0, "q2", priority_class="dev", rank=5, max_queue=2)

    assert refused[:3] == [-2, "queue_full", 2]
    assert lua.acquire(T0, "other", priority_class="qa", rank=4, max_queue=2)[0] == 0
    assert lua.client.get(keys.queue_length(MODEL, "dev")) == b"2"
    assert lua.client.exists(keys.waiter("q2", MODEL)) == 0


def test_max_concurrent_refuses_at_the_limit_and_frees_with_a_release(lua):
    lua.fleet(T0, (R1, 0))
    options = {"use_case": "7", "max_concurrent": 2, "replicas": [(R1, 10)]}
    assert lua.acquire(T0, "c1", **options) == [1, R1]
    assert lua.acquire(T0, "c2", **options) == [1, R1]

    assert lua.acquire(T0, "c3", **options)[:3] == [-1, "max_concurrent", 2]

    lua.release(T0 + 1_000, "c1")
    assert lua.client.get(keys.concurrency("acme", "7")) == b"1"
    assert lua.acquire(T0 + 1_000, "c4", **options) == [1, R1]


def test_a_use_case_waiter_counts_against_its_max_concurrent_and_never_blocks_the_queue(lua):
    """GIVEN a use case limited to 1, with one request waiting for a slot, WHEN a second one
    arrives, THEN it is refused (the waiter counts against the limit), and the waiter, once
    at the head, is granted as soon as a slot frees, ahead of a later use case's waiter."""
    lua.fleet(T0, (R1, 0))
    pool = {"replicas": [(R1, 2)]}
    limited = {"use_case": "7", "max_concurrent": 1, **pool}
    assert lua.acquire(T0, "o1", use_case="8", **pool) == [1, R1]
    assert lua.acquire(T0, "o2", use_case="8", **pool) == [1, R1]
    assert lua.acquire(T0, "b1", **limited)[0] == 0
    assert lua.acquire(T0, "b2", **limited)[:3] == [-1, "max_concurrent", 1]
    assert lua.acquire(T0, "n1", use_case="9", **pool)[0] == 0

    lua.release(T0 + 1, "o1")
    assert lua.queue() == ["n1"]  # b1 granted

    lua.release(T0 + 2, "o2")
    assert lua.queue() == []
    assert lua.client.get(keys.concurrency("acme", "7")) == b"1"


def test_cancel_removes_a_waiter(lua):
    busy(lua)
    assert lua.acquire(T0, "w", priority_class="prod")[0] == 0

    assert lua.cancel(T0 + 1, "w")[0] == 1

    assert lua.queue() == []
    assert lua.client.exists(keys.waiter("w", MODEL), keys.queue_length(MODEL, "prod")) == 0
    assert lua.client.zcard(keys.queue_deadlines(MODEL)) == 0


def test_cancel_after_a_grant_raced_in_releases_it_or_keeps_it(lua):
    busy(lua)
    assert lua.acquire(T0, "w1")[0] == 0
    assert lua.acquire(T0, "w2")[0] == 0
    lua.release(T0 + 1, "holder")  # grants w1, which has not noticed yet

    assert lua.cancel(T0 + 2, "w1", keep=True) == [2, R1]
    assert lua.in_flight() == {R1: 1}

    assert lua.cancel(T0 + 3, "w1") == [0, R1]  # released, and w2 pumped into the slot
    assert holder_of(lua) == "w2"
    assert lua.in_flight() == {R1: 1}
    assert lua.client.exists(keys.lease("w1", MODEL), keys.grant("w1", MODEL)) == 0


def test_a_cancel_that_arrives_before_its_acquire_makes_the_acquire_refuse(lua):
    lua.fleet(T0, (R1, 0))
    assert lua.cancel(T0, "early") == [-1]
    assert lua.acquire(T0, "early") == [-3, "cancelled"]
    assert lua.in_flight() == {}


def test_release_is_idempotent_and_never_goes_below_zero(lua):
    busy(lua, use_case="3", max_concurrent=5)
    assert lua.release(T0 + 1, "holder") == [1, 0, 0]
    assert lua.release(T0 + 2, "holder") == [0, 0, 0]
    assert lua.in_flight() == {}
    assert lua.client.exists(keys.concurrency("acme", "3")) == 0


def test_reap_releases_expired_leases_and_grants_the_waiters(lua):
    busy(lua, lease_ms=1_000)
    assert lua.acquire(T0, "waiter", deadline=T0 + 10_000)[0] == 0

    assert [int(v) for v in lua("reap", T0 + 999)] == [0, 0, 0]
    assert [int(v) for v in lua("reap", T0 + 1_000)] == [1, 0, 1]

    assert holder_of(lua) == "waiter"
    assert lua.in_flight() == {R1: 1}


def test_reap_and_pump_drop_waiters_past_their_deadline(lua):
    lua.fleet(T0, (R1, 9))
    assert lua.acquire(T0, "old", deadline=T0 + 500, priority_class="dev")[0] == 0
    assert lua.acquire(T0, "young", deadline=T0 + 5_000, priority_class="dev")[0] == 0

    assert [int(v) for v in lua("reap", T0 + 600)] == [0, 1, 0]
    assert lua.queue() == ["young"]
    assert lua.client.get(keys.queue_length(MODEL, "dev")) == b"1"

    lua.fleet(T0 + 6_000, (R1, 0))  # room again, but "young" expired too: pump drops it
    assert lua("pump", T0 + 6_000, MODEL) == 0
    assert lua.queue() == []
    assert lua.client.exists(keys.queue_length(MODEL, "dev")) == 0


def test_renew_extends_a_lease_until_it_is_reaped(lua):
    busy(lua, lease_ms=1_000)
    assert lua("renew", T0 + 900, 1_000, "holder", MODEL) == [1]
    assert lua.client.zscore(keys.leases(MODEL), "holder") == T0 + 1_900
    assert lua("reap", T0 + 1_500) == [0, 0, 0]

    assert lua("reap", T0 + 1_900) == [1, 0, 0]
    assert lua("renew", T0 + 2_000, 1_000, "holder", MODEL) == [0]


def test_one_renew_call_extends_every_lease_of_a_gateway_and_names_the_lost_ones(lua):
    lua.fleet(T0, (R1, 0))
    assert lua.acquire(T0, "a", replicas=((R1, 5),), lease_ms=1_000) == [1, R1]
    assert lua.acquire(T0, "b", replicas=((R1, 5),), lease_ms=1_000) == [1, R1]

    renewed = lua("renew", T0 + 500, 1_000, "a", MODEL, "gone", MODEL, "b", MODEL)

    assert renewed == [1, 0, 1]
    assert lua.client.zscore(keys.leases(MODEL), "a") == T0 + 1_500
    assert lua.client.zscore(keys.leases(MODEL), "b") == T0 + 1_500
    assert lua.client.zscore(keys.leases(MODEL), "gone") is None


def test_prefix_affinity_prefers_the_same_replica_while_it_has_room(lua):
    lua.fleet(T0, (R1, 0), (R2, 0))
    pool = [(R1, 2), (R2, 2)]
    assert lua.acquire(T0, "p1", prefix_hash="abc", replicas=pool) == [1, R1]
    assert lua.acquire(T0, "x1", replicas=pool) == [1, R2]  # least in flight
    assert lua.acquire(T0, "x2", replicas=pool)[1] in (R1, R2)
    lua.release(T0, "x2")
    # R1 and R2 hold one each; the prefix goes back to R1 even though R2 is as free.
    assert lua.acquire(T0, "p2", prefix_hash="abc", replicas=pool) == [1, R1]
    # R1 is full now: fall back to R2, which becomes the prefix's replica.
    assert lua.acquire(T0, "p3", prefix_hash="abc", replicas=pool) == [1, R2]
    assert lua.client.get(keys.affinity(MODEL, "abc")) == R2.encode()


def test_virtual_time_is_rebased_when_the_queue_is_empty(lua):
    lua.client.hset(keys.virtual_time(MODEL), mapping={"_clock": 2**39 + 10, "t:acme": 2**39 + 50})
    lua.fleet(T0, (R1, 0))
    assert lua.acquire(T0, "r", tenant="acme", cost=100) == [1, R1]
    clock, finish = lua.client.hmget(keys.virtual_time(MODEL), "_clock", "t:acme")
    assert (float(clock), float(finish)) == (40.0, 140.0)


def test_the_pool_is_recorded_for_the_scripts_that_are_not_given_it(lua):
    lua.fleet(T0, (R1, 0), (R2, 0))
    lua.acquire(T0, "r", replicas=[(R1, 3), (R2, 5)], stale_ms=800, threshold=4)
    stored = {k.decode(): v.decode() for k, v in lua.client.hgetall(keys.pool(MODEL)).items()}
    assert stored.pop("_sig")
    assert stored == {R1: "3", R2: "5", "_stale_ms": "800", "_threshold": "4", "_lanes": "0"}
    assert set(lua.client.smembers(keys.pool_members(MODEL))) == {MODEL.encode()}

    lua.acquire(T0, "s", replicas=[(R2, 5)], stale_ms=800, threshold=4)
    assert set(lua.client.hkeys(keys.pool(MODEL))) == {
        R2.encode(),
        b"_stale_ms",
        b"_threshold",
        b"_lanes",
        b"_sig",
    }


# --- backpressure between scrapes --------------------------------------------------------


def grants(lua: Lua, now: int, prefix: str, count: int, **options: Any) -> int:
    """Send ``count`` acquires; how many were granted at once (the rest wait)."""
    return sum(lua.acquire(now, f"{prefix}{n}", **options)[0] == 1 for n in range(count))


def test_a_replica_seen_with_a_queue_gets_what_the_threshold_leaves_until_the_next_scrape(lua):
    """GIVEN a scrape that saw 2 requests waiting in vLLM (threshold 3, cap 64), WHEN requests
    keep coming before the next scrape, THEN one more is granted (the one that makes 3
    waiting), not 62; a release frees a slot for one more, and a new scrape starts over."""
    options: dict[str, Any] = {"replicas": [(R1, 64)], "threshold": 3}
    lua.fleet(T0, (R1, 2), in_flight=0)

    assert grants(lua, T0 + 10, "burst-", 20, **options) == 1
    assert lua.in_flight() == {R1: 1}
    assert len(lua.queue()) == 19

    # A request finished since the scrape: one of the waiting ones runs, one more may wait.
    assert lua.release(T0 + 20, "burst-0") == [1, 1, 0]
    assert lua.in_flight() == {R1: 1}
    assert len(lua.queue()) == 18

    # The next scrape sees vLLM's queue drained to 0 (in flight 1 when it began).
    lua.fleet(T0 + 250, (R1, 0), in_flight=1)
    assert lua("pump", T0 + 250, MODEL) == 18
    assert lua.in_flight() == {R1: 19}


def test_grants_made_before_the_scrape_are_not_counted_again(lua):
    lua.fleet(T0, (R1, 0))
    assert grants(lua, T0, "early-", 5, replicas=[(R1, 64)]) == 5
    # The scrape saw those 5 (3 running, 2 waiting) with 5 of the pool in flight.
    lua.fleet(T0 + 250, (R1, 2), in_flight=5)
    assert grants(lua, T0 + 260, "late-", 5, replicas=[(R1, 64)]) == 1
    assert lua.in_flight() == {R1: 6}


def test_a_pump_counts_its_own_grants_against_vllms_queue(lua):
    lua.fleet(T0, (R1, 9))
    for n in range(6):
        assert lua.acquire(T0, f"w{n}", replicas=[(R1, 64)])[0] == 0
    lua.fleet(T0 + 250, (R1, 1), in_flight=0)

    assert lua("pump", T0 + 250, MODEL) == 2  # 1 waiting + 2 granted = the threshold
    assert len(lua.queue()) == 4


def test_a_scrape_that_saw_an_empty_queue_keeps_the_plain_rule(lua):
    lua.fleet(T0, (R1, 0), in_flight=0)
    assert grants(lua, T0, "r", 10, replicas=[(R1, 8)]) == 8


def test_an_entry_without_the_in_flight_field_keeps_the_plain_rule(lua):
    """Entries written by older watchers, or by the gateway for a failed replica."""
    lua.client.hset(keys.fleet(MODEL), R1, f"2|0|0.1000|{T0}")
    assert grants(lua, T0, "r", 10, replicas=[(R1, 8)]) == 8


def test_a_learned_batch_size_caps_what_a_replica_is_sent(lua):
    """GIVEN a replica whose batch the watcher learned as 4 and the default cap of 64, WHEN a
    burst arrives while its last scrape saw it idle, THEN it is sent 4 + threshold requests
    (vLLM's queue reaches the threshold, as after a grant to a replica seen with 2 waiting),
    not 64; the policy's cap still applies when it is the smaller."""
    lua.fleet(T0, (R1, 0), in_flight=0, max_running=4)
    assert grants(lua, T0, "burst-", 20, replicas=[(R1, 64)], threshold=3) == 7
    assert lua.in_flight() == {R1: 7}

    lua.client.delete(keys.in_flight(MODEL), keys.queue(MODEL))
    assert grants(lua, T0, "small-cap-", 10, replicas=[(R1, 2)], threshold=3) == 2


# --- gateway heartbeats -------------------------------------------------------------------


def test_a_waiter_of_a_gateway_without_heartbeat_is_dropped_not_granted(lua):
    """GIVEN waiters of a gateway whose heartbeat expired and of one that never had one,
    queued before a live gateway's waiter, WHEN the slot frees, THEN the dead gateways'
    waiters are dropped (no grant, no message, their class count given back) and the live
    gateway's waiter is granted."""
    listener = lua.client.pubsub(ignore_subscribe_messages=True)
    listener.subscribe("sy:gw:gw-dead", "sy:gw:gw-never", "sy:gw:gw-a")
    lua.heartbeat("gw-dead", T0 + 500)
    busy(lua)
    for n, gateway in enumerate(("gw-dead", "gw-never", "gw-a")):
        assert lua.acquire(T0 + n, f"w-{gateway}", gateway=gateway, priority_class="dev")[0] == 0

    assert lua.release(T0 + 1_000, "holder") == [1, 1, 0]

    assert holder_of(lua) == "w-gw-a"
    assert lua.queue() == []
    assert lua.client.exists(keys.grant("w-gw-dead", MODEL), keys.grant("w-gw-never", MODEL)) == 0
    assert lua.client.exists(keys.waiter("w-gw-dead", MODEL), keys.waiter("w-gw-never", MODEL)) == 0
    assert lua.client.exists(keys.queue_length(MODEL, "dev")) == 0
    messages = []
    for _ in range(10):
        message = listener.get_message(timeout=0.2)
        if message is not None:
            messages.append((message["channel"], message["data"]))
        if messages:
            break
    assert messages == [(b"sy:gw:gw-a", f"w-gw-a {R1}".encode())]
    listener.close()


def test_a_heartbeat_counts_until_its_expiry(lua):
    lua.heartbeat("gw-c", T0 + 1_000)
    busy(lua)
    assert lua.acquire(T0, "w", gateway="gw-c")[0] == 0
    assert lua.release(T0 + 1_000, "holder") == [1, 1, 0]  # still alive at its expiry
    assert holder_of(lua) == "w"


def test_reap_releases_the_leases_and_drops_the_waiters_of_a_gateway_whose_heartbeat_expired(
    lua,
):
    """GIVEN gateway c (heartbeat until T0+5 s) holding the only slot on a 30 s lease and with
    a request queued, and a live gateway's request queued behind it, WHEN a reaper passes
    after c's heartbeat expired, THEN c's lease is released, its waiter dropped, the live
    waiter granted, and c leaves the registry: its capacity came back 25 s early."""
    lua.heartbeat("gw-c", T0 + 5_000)
    busy(lua, gateway="gw-c", lease_ms=30_000)
    assert lua.acquire(T0 + 1, "c-waiter", gateway="gw-c")[0] == 0
    assert lua.acquire(T0 + 2, "a-waiter", gateway="gw-a")[0] == 0

    lua.fleet(T0 + 5_000, (R1, 0))
    assert lua("reap", T0 + 5_000) == [0, 0, 0]
    assert lua("reap", T0 + 5_001) == [1, 1, 1]

    assert holder_of(lua) == "a-waiter"
    assert lua.queue() == []
    assert lua.client.exists(keys.lease("holder", MODEL), keys.waiter("c-waiter", MODEL)) == 0
    assert lua.client.zscore(keys.gateways(MODEL), "gw-c") is None
    assert lua.client.zscore(keys.gateways(MODEL), "gw-a") is not None
    assert lua("reap", T0 + 6_000) == [0, 0, 0]


def test_a_lease_of_a_gateway_alive_is_left_to_its_expiry(lua):
    lua.heartbeat("gw-c", T0 + 60_000)
    busy(lua, gateway="gw-c", lease_ms=1_000)
    assert lua("reap", T0 + 500) == [0, 0, 0]
    assert lua("reap", T0 + 1_000) == [1, 0, 0]


# --- Retry-After: demand of better ranks -------------------------------------------------


def test_queue_full_and_cancel_report_the_recent_arrival_rate_of_better_ranks(lua):
    """GIVEN 20 prod (rank 0) requests enqueued in the last 10 s and dev (rank 5) requests
    queued behind them, WHEN a dev request is refused for a full queue, or a dev waiter
    gives up, THEN the reply carries prod's arrival rate (2/s, as 2000 per 1000 s) and
    counts the prod waiters ahead; dev's own arrivals are not in the rate."""
    busy(lua)
    for n in range(20):
        assert lua.acquire(T0 + 100 * n, f"prod-{n}", rank=0)[0] == 0
    dev: dict[str, Any] = {"rank": 5, "priority_class": "dev", "max_queue": 2}
    assert lua.acquire(T0 + 3_000, "dev-0", **dev)[0] == 0
    assert lua.acquire(T0 + 3_000, "dev-1", **dev)[0] == 0

    refused = lua.acquire(T0 + 5_000, "dev-2", **dev)
    assert refused[:3] == [-2, "queue_full", 22]
    assert int(refused[5]) == 2_000

    # Half a window later, the first window counts half: 1/s.
    assert lua.cancel(T0 + 15_000, "dev-1") == [1, 21, -1, 1, 1_000]
    # A prod request sees no better rank.
    assert lua.cancel(T0 + 15_000, "prod-19")[4] == 0


# -- classes that may hold only a share of the pool (file and async work) -------------------


def test_a_class_with_a_pool_share_is_granted_only_up_to_its_share(lua):
    """GIVEN two replicas of 4 slots each and a batch class that may hold half the pool,
    WHEN batch work floods it, THEN 4 are granted, the rest wait with slots still free, and
    a prod request arriving then is granted at once."""
    pool = [(R1, 4), (R2, 4)]
    lua.fleet(T0, (R1, 0), (R2, 0))
    batch = {"rank": 9, "priority_class": "batch", "pool_share": 500, "replicas": pool}
    replies = [lua.acquire(T0, f"b{n}", **batch)[0] for n in range(6)]

    assert replies == [1, 1, 1, 1, 0, 0]
    assert lua.client.hget(keys.pool_prefix(MODEL) + f"cif:{MODEL}", "batch") == b"4"
    assert lua.queue() == ["b4", "b5"]
    assert lua.acquire(T0, "prod", rank=0, replicas=pool)[0] == 1


def test_a_release_of_a_capped_class_grants_its_next_waiter_and_skips_it_when_full(lua):
    """GIVEN the batch class at its share with waiters, WHEN a prod request ends, THEN no
    batch waiter is granted (the class is full) although a slot is free; WHEN a batch
    request ends, THEN the next batch waiter takes its place."""
    pool = [(R1, 4)]
    lua.fleet(T0, (R1, 0))
    batch = {"rank": 9, "priority_class": "batch", "pool_share": 500, "replicas": pool}
    assert lua.acquire(T0, "prod-1", rank=0, replicas=pool)[0] == 1
    assert [lua.acquire(T0, f"b{n}", **batch)[0] for n in range(3)] == [1, 1, 0]

    assert lua.release(T0 + 10, "prod-1")[1] == 0  # a slot is free, but batch holds 2 of 4
    assert lua.queue() == ["b2"]

    assert lua.release(T0 + 20, "b0")[1] == 1
    assert lua.queue() == []
    assert lua.client.hget(keys.pool_prefix(MODEL) + f"cif:{MODEL}", "batch") == b"2"


def test_a_full_capped_class_does_not_hold_up_waiters_of_a_worse_rank_behind_it(lua):
    """The pump skips a full class rank by rank: a waiter of a worse rank (here an
    unbounded class behind the capped one) still gets a free slot."""
    pool = [(R1, 4)]
    lua.fleet(T0, (R1, 0))
    batch = {"rank": 5, "priority_class": "batch", "pool_share": 250, "replicas": pool}
    assert lua.acquire(T0, "holder", rank=0, replicas=pool)[0] == 1
    assert lua.acquire(T0, "b0", **batch)[0] == 1
    assert lua.acquire(T0, "b1", **batch)[0] == 0
    lua.fleet(T0, (R1, 5))  # saturated: the next arrival has to wait
    assert lua.acquire(T0, "late", rank=7, priority_class="scavenger", replicas=pool)[0] == 0

    lua.fleet(T0 + 250, (R1, 0))
    lua.release(T0 + 250, "holder")

    assert lua.queue() == ["b1"]  # still bounded by its share; the worse rank went ahead
    assert lua.client.hexists(keys.lease("late", MODEL), "replica")


def test_a_reaped_lease_of_a_capped_class_gives_its_share_back(lua):
    pool = [(R1, 2)]
    lua.fleet(T0, (R1, 0))
    batch = {"rank": 9, "priority_class": "batch", "pool_share": 500, "replicas": pool}
    assert lua.acquire(T0, "b0", lease_ms=1_000, **batch)[0] == 1
    assert lua.acquire(T0, "b1", **batch)[0] == 0

    lua.fleet(T0 + 2_000, (R1, 0))
    lua("reap", T0 + 2_000)

    assert lua.queue() == []  # b0's lease expired: its share went to b1
    assert lua.client.hget(keys.pool_prefix(MODEL) + f"cif:{MODEL}", "batch") == b"1"
