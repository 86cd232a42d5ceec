"""Long-prompt lanes (common.lua pick): in a pool with lanes, a long prompt prefills only on a
replica no short request runs on, and short requests keep off replicas running long prompts
and off the one being drained for a waiting long prompt. Scripts called directly against the
session's real valkey-server, time driven through now_ms."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.scheduling import keys
from tests.gateway.scheduling.conftest import FOREVER_MS, MODEL, R1, R2, Lua

T0 = 1_800_000_000_000
R3 = "http://10.0.0.3:8000"
POOL = ((R1, 4), (R2, 4), (R3, 4))


@pytest.fixture(autouse=True)
def live_gateway(lua: Lua) -> None:
    lua.heartbeat("gw-a", FOREVER_MS)


def fresh(lua: Lua, now: int = T0) -> None:
    lua.fleet(now, (R1, 0), (R2, 0), (R3, 0))


def short(lua: Lua, now: int, request_id: str, **options: Any) -> list[Any]:
    return lua.acquire(now, request_id, replicas=POOL, lanes=True, **options)


def long(lua: Lua, now: int, request_id: str, **options: Any) -> list[Any]:
    return lua.acquire(now, request_id, replicas=POOL, lanes=True, long=True, **options)


def replica_of(lua: Lua, request_id: str) -> str:
    return lua.client.hget(keys.lease(request_id, MODEL), "replica").decode()


def longs_in_flight(lua: Lua) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in lua.client.hgetall(keys.long_prompts(MODEL)).items()}


def drained(lua: Lua) -> str | None:
    value = lua.client.get(keys.drain(MODEL))
    return value.decode() if value is not None else None


def test_a_long_prompt_goes_to_an_idle_replica_and_short_ones_keep_off_it(lua):
    fresh(lua)
    assert long(lua, T0, "think-1") == [1, R1]
    assert longs_in_flight(lua) == {R1: 1}

    placed = [short(lua, T0, f"s{n}")[1] for n in range(8)]

    assert R1 not in placed
    assert sorted(placed) == [R2] * 4 + [R3] * 4


def test_only_background_work_runs_beside_long_prompts_when_the_other_replicas_are_full(lua):
    """GIVEN a long prompt on R1 and R2, R3 full, WHEN an interactive request arrives, THEN it
    waits rather than share R1 with a prefill; a request of a class with a pool share (async,
    files, batch) is placed there."""
    fresh(lua)
    assert long(lua, T0, "think-1") == [1, R1]
    for n in range(8):
        short(lua, T0, f"s{n}")

    assert short(lua, T0, "interactive")[0] == 0
    assert short(lua, T0, "background", rank=4, priority_class="batch", pool_share=500) == [
        1,
        R1,
    ]
    assert lua.queue() == ["interactive"]

    lua.release(T0 + 1, "s0")

    assert lua.queue() == []
    assert replica_of(lua, "interactive") in (R2, R3)


def test_a_long_prompt_waits_for_a_replica_to_drain_and_short_ones_keep_off_that_one(lua):
    """GIVEN short requests on every replica, WHEN a long prompt arrives, THEN it waits, the
    replica with the fewest short requests is drained for it (new short requests go to the
    others), and it is granted there once that replica's last short request ends."""
    fresh(lua)
    for n, replica in enumerate([R1, R2, R3, R1, R2]):
        assert short(lua, T0, f"s{n}") == [1, replica]

    assert long(lua, T0 + 1, "think-1")[0] == 0
    assert drained(lua) == R3

    assert [short(lua, T0 + 2, f"t{n}")[1] for n in range(4)] == [R1, R2, R1, R2]
    assert lua.queue() == ["think-1"]

    lua.release(T0 + 3, "s2")  # R3's only short request

    assert lua.queue() == []
    assert replica_of(lua, "think-1") == R3
    assert drained(lua) is None
    assert longs_in_flight(lua) == {R3: 1}


def test_a_waiting_long_prompt_does_not_hold_up_short_requests_behind_it(lua):
    """A long prompt at the head of the queue that no replica can take yet is passed over:
    the short requests queued after it are granted on the replicas that are not drained."""
    fresh(lua)
    full = ((R1, 2), (R2, 2), (R3, 2))
    for n in range(6):
        assert lua.acquire(T0, f"s{n}", replicas=full, lanes=True)[0] == 1
    assert lua.acquire(T0 + 1, "think-1", replicas=full, lanes=True, long=True)[0] == 0
    assert lua.acquire(T0 + 2, "after", replicas=full, lanes=True)[0] == 0
    assert lua.queue() == ["think-1", "after"]
    drain = drained(lua)
    other = next(s for s in ("s0", "s1", "s2") if replica_of(lua, s) != drain)
    freed = replica_of(lua, other)

    lua.release(T0 + 3, other)  # its replica keeps one short request: no place for think-1

    assert lua.queue() == ["think-1"]
    assert replica_of(lua, "after") == freed


def test_a_long_prompt_takes_the_first_replica_left_with_no_short_request(lua):
    fresh(lua)
    full = ((R1, 1), (R2, 1), (R3, 1))
    for n in range(3):
        assert lua.acquire(T0, f"s{n}", replicas=full, lanes=True)[0] == 1
    assert lua.acquire(T0 + 1, "think-1", replicas=full, lanes=True, long=True)[0] == 0
    drain = drained(lua)
    other = next(s for s in ("s0", "s1", "s2") if replica_of(lua, s) != drain)
    freed = replica_of(lua, other)

    lua.release(T0 + 3, other)

    assert replica_of(lua, "think-1") == freed
    assert drained(lua) is None


def test_releasing_a_long_prompt_opens_its_replica_to_short_requests_again(lua):
    fresh(lua)
    assert long(lua, T0, "think-1") == [1, R1]
    lua.release(T0 + 1, "think-1")

    assert longs_in_flight(lua) == {}
    assert [short(lua, T0 + 2, f"s{n}")[1] for n in range(3)] == [R1, R2, R3]


def test_a_long_prompt_that_gives_up_ends_the_drain(lua):
    fresh(lua)
    for n in range(3):
        short(lua, T0, f"s{n}")
    assert long(lua, T0 + 1, "think-1")[0] == 0
    assert drained(lua) is not None

    assert lua.cancel(T0 + 2, "think-1")[0] == 1

    assert drained(lua) is None


def test_a_reaped_long_prompt_gives_its_lane_back(lua):
    fresh(lua)
    assert long(lua, T0, "think-1", lease_ms=1_000) == [1, R1]

    lua("reap", T0 + 2_000)

    assert longs_in_flight(lua) == {}


def test_long_prompts_share_the_replica_already_running_long_prompts(lua):
    fresh(lua)
    assert long(lua, T0, "think-1") == [1, R1]
    assert long(lua, T0, "think-2") == [1, R1]
    assert longs_in_flight(lua) == {R1: 2}


def test_without_lanes_a_long_prompt_is_placed_like_any_request(lua):
    lua.fleet(T0, (R1, 0), (R2, 0))
    pool = ((R1, 4), (R2, 4))
    lua.acquire(T0, "s0", replicas=pool)
    assert lua.acquire(T0, "think-1", replicas=pool, long=True) == [1, R2]
    assert longs_in_flight(lua) == {}
    assert lua.acquire(T0, "s1", replicas=pool) == [1, R1]


def background(lua: Lua, now: int, request_id: str) -> list[Any]:
    return short(lua, now, request_id, rank=4, priority_class="batch", pool_share=900)


def test_a_long_prompt_prefills_beside_background_work_but_never_beside_interactive(lua):
    """Background work does not mind a prefill: a replica running only background requests
    takes a long prompt at once, while one with an interactive request is drained first."""
    fresh(lua)
    assert short(lua, T0, "i0") == [1, R1]
    assert background(lua, T0, "b0") == [1, R2]
    assert short(lua, T0, "i1") == [1, R3]

    assert long(lua, T0 + 1, "think-1") == [1, R2]
    assert drained(lua) is None


def test_background_work_may_use_the_replica_being_drained(lua):
    fresh(lua)
    for n in range(3):
        short(lua, T0, f"i{n}")
    assert long(lua, T0 + 1, "think-1")[0] == 0
    drain = drained(lua)

    assert background(lua, T0 + 2, "b0") == [1, drain]
    assert short(lua, T0 + 2, "i3")[1] != drain

    lua.release(T0 + 3, next(f"i{n}" for n in range(3) if replica_of(lua, f"i{n}") == drain))

    assert replica_of(lua, "think-1") == drain  # beside b0: background work
    lua.release(T0 + 4, "b0")
    assert lua.client.hgetall(keys.background(MODEL)) == {}
