"""A use case at its max concurrent must not stand in anyone else's way (issue 10, item 7).

Its requests count against the cap while they wait as well as while they run, so a waiter
of a capped use case can always be granted when it reaches the head of the queue: it never
blocks the pump, and better-ranked waiters of a capped use case never hold back a lower rank
while replicas sit idle.
"""

from __future__ import annotations

import pytest

from gateway.scheduling import keys
from tests.gateway.scheduling.conftest import FOREVER_MS, MODEL, R1, R2, Lua

T0 = 1_800_000_000_000
POOL = {"replicas": [(R1, 8), (R2, 8)]}


@pytest.fixture(autouse=True)
def live_gateways(lua: Lua) -> None:
    lua.heartbeat("gw-a", FOREVER_MS)


def test_a_rank_0_use_case_capped_at_2_does_not_hold_back_rank_1_while_replicas_have_room(lua):
    """GIVEN a rank-0 use case capped at 2 that sends 40 requests while every replica is
    saturated, WHEN the replicas drain, THEN its 2 admitted requests are granted and rank-1
    requests are granted at once, not queued behind the capped ones."""
    lua.fleet(T0, (R1, 9), (R2, 9))  # vLLM's own queues over the threshold: no room
    capped = {"rank": 0, "use_case": "7", "max_concurrent": 2, **POOL}
    replies = [lua.acquire(T0, f"capped-{n}", **capped) for n in range(40)]

    assert [reply[0] for reply in replies[:2]] == [0, 0]  # queued: no replica had room
    # The rest would be the use case's 3rd..40th request in flight or waiting.
    assert {tuple(reply[:2]) for reply in replies[2:]} == {(-1, "max_concurrent")}
    assert lua.client.get(keys.concurrency("acme", "7")) == b"2"

    lua.fleet(T0 + 1, (R1, 0), (R2, 0))
    assert lua("pump", T0 + 1, MODEL) == 2
    assert lua.queue() == []

    for n in range(6):
        reply = lua.acquire(T0 + 2, f"rank1-{n}", rank=1, use_case="8", **POOL)
        assert reply[0] == 1, f"rank-1 request {n} was not granted at once: {reply}"
    assert sum(lua.in_flight().values()) == 8
    assert lua.client.get(keys.concurrency("acme", "7")) == b"2"


def test_waiters_of_a_capped_use_case_give_their_place_in_the_cap_back_when_they_leave(lua):
    """A waiter that is cancelled, or dropped at its deadline, no longer counts against its
    use case's cap; one that is granted counts as running until released."""
    lua.fleet(T0, (R1, 9))
    capped = {"use_case": "7", "max_concurrent": 2, "replicas": [(R1, 8)]}
    assert lua.acquire(T0, "a", deadline=T0 + 100, **capped)[0] == 0
    assert lua.acquire(T0, "b", **capped)[0] == 0
    assert lua.acquire(T0, "c", **capped)[:2] == [-1, "max_concurrent"]

    assert lua.cancel(T0 + 1, "b")[0] == 1
    assert lua.client.get(keys.concurrency("acme", "7")) == b"1"
    assert [int(v) for v in lua("reap", T0 + 100)] == [0, 1, 0]  # "a" past its deadline
    assert lua.client.exists(keys.concurrency("acme", "7")) == 0

    assert lua.acquire(T0 + 101, "d", **capped)[0] == 0
    lua.fleet(T0 + 102, (R1, 0))
    assert lua("pump", T0 + 102, MODEL) == 1
    assert lua.client.get(keys.concurrency("acme", "7")) == b"1"  # "d" now runs
    assert lua.release(T0 + 103, "d")[0] == 1
    assert lua.client.exists(keys.concurrency("acme", "7")) == 0
