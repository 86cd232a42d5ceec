"""The rate limits inside acquire.lua and release.lua (limits.lua), called directly with the
caller's clock: an admitted request is enqueued (its pool has no replica here, so nothing is
granted) and counted; a refused one writes nothing."""

from __future__ import annotations

import itertools
from typing import Any, cast

import pytest
import valkey

from gateway.scheduling import keys

from .conftest import Lua

W = 60_000
WINDOW_START = 1_000 * W  # window index 1000 begins here


@pytest.fixture
def admit(lua: Lua):
    ids = itertools.count()

    def call(now: int, *limits: tuple[str, str, int, int, int]) -> list[int]:
        stems = [(keys.rate_limit(limit_id), *rest) for limit_id, *rest in limits]
        reply = lua.acquire(now, f"r{next(ids)}", replicas=(), limits=stems)  # type: ignore[arg-type]
        if int(reply[0]) in (0, 1):  # enqueued or granted: admitted by the limits
            return [1]
        assert reply[:2] == [-4, "rate_limited"], reply
        return [0, int(reply[2]), int(reply[3])]

    return call


@pytest.fixture
def reconcile(lua: Lua):
    def call(now: int, *windows: tuple[str, int, int, int]) -> int:
        stems = [(keys.rate_limit(limit_id), *rest) for limit_id, *rest in windows]
        released, _, adjusted = lua.release(now, "no-such-lease", reconcile=stems)  # type: ignore[arg-type]
        assert released == 0
        return adjusted

    return call


def counters(db: valkey.Valkey) -> dict[bytes, Any]:
    """Every key, serialized, with its expiry time: the whole state a refusal must leave alone."""
    return {key: (db.dump(key), db.pexpiretime(key)) for key in db.keys("*")}


def windows(db: valkey.Valkey) -> list[Any]:
    return cast(list[Any], db.keys(keys.KEY_PREFIX + "rl:*"))


def test_an_admitted_request_counts_on_every_window(db, admit):
    now = WINDOW_START + 5_000
    assert admit(now, ("rpm", "req", W, 10, 1), ("tpm", "tok", W, 10_000, 750)) == [1]
    assert db.get(keys.rate_window(keys.rate_limit("rpm"), 1000)) == b"1"
    assert db.get(keys.rate_window(keys.rate_limit("tpm"), 1000)) == b"750"
    assert 0 < db.pttl(keys.rate_window(keys.rate_limit("tpm"), 1000)) <= 2 * W


def test_a_refused_request_leaves_every_counter_unchanged(db, admit):
    """GIVEN three limits where only the last is full, WHEN a request is refused by it,
    THEN the two limits that had room were not charged either (all or nothing)."""
    now = WINDOW_START + 1_000
    limits = [("global", "req", W, 100, 1), ("tenant", "tok", W, 5_000, 1_000)]
    assert admit(now, *limits, ("uc", "req", W, 2, 1)) == [1]
    assert admit(now, *limits, ("uc", "req", W, 2, 1)) == [1]
    before = counters(db)
    ttl = db.pttl(keys.rate_window(keys.rate_limit("global"), 1000))

    refused = admit(now + 10, *limits, ("uc", "req", W, 2, 1))

    assert refused[:2] == [0, 3]
    assert counters(db) == before  # nor the queue: a refusal writes nothing at all
    assert (
        db.pttl(keys.rate_window(keys.rate_limit("global"), 1000)) <= ttl
    )  # not even the TTL was touched


def test_retry_after_waits_for_the_previous_window_to_fade(admit):
    # 10 requests in the previous window; half-way through this one they weigh 5.
    previous = WINDOW_START - W + 100
    for _ in range(10):
        assert admit(previous, ("rpm", "req", W, 10, 1)) == [1]
    now = WINDOW_START + W // 2
    for _ in range(5):
        assert admit(now, ("rpm", "req", W, 10, 1)) == [1]

    # estimate 10 * (1 - e/W) + 5 + 1 <= 10 once e >= 36 s: 6 s from now.
    assert admit(now, ("rpm", "req", W, 10, 1)) == [0, 1, 6_000]
    assert admit(now + 5_999, ("rpm", "req", W, 10, 1))[0] == 0
    assert admit(now + 6_000, ("rpm", "req", W, 10, 1)) == [1]


def test_retry_after_reaches_into_the_next_window_when_this_one_is_full(admit):
    for _ in range(10):
        assert admit(WINDOW_START, ("rpm", "req", W, 10, 1)) == [1]
    # Next window: 10 * (1 - e/W) + 1 <= 10 once e >= 6 s; 66 s from now.
    assert admit(WINDOW_START, ("rpm", "req", W, 10, 1)) == [0, 1, 66_000]
    assert admit(WINDOW_START + 65_999, ("rpm", "req", W, 10, 1))[0] == 0
    assert admit(WINDOW_START + 66_000, ("rpm", "req", W, 10, 1)) == [1]


def test_token_retry_after_accounts_for_the_request_size(admit):
    now = WINDOW_START + 30_000
    assert admit(now, ("tpm", "tok", W, 10_000, 8_000)) == [1]
    # 8000 + 4000 > 10000 until 8000 * (1 - e/W) + 4000 <= 10000 in the next window:
    # e >= 15 s, so 30 s (rest of this window) + 15 s.
    assert admit(now, ("tpm", "tok", W, 10_000, 4_000)) == [0, 1, 45_000]
    assert admit(now + 45_000, ("tpm", "tok", W, 10_000, 4_000)) == [1]


def test_a_request_larger_than_the_limit_never_fits(db, admit):
    assert admit(WINDOW_START, ("tpm", "tok", W, 1_000, 1_001)) == [0, 1, -1]
    assert db.keys("*") == []  # refused before anything was written


def test_reconcile_refunds_and_charges_the_admission_windows(db, admit, reconcile):
    now = WINDOW_START + 1_000
    assert admit(now, ("tpm", "tok", W, 10_000, 2_000), ("tpd", "tok", 86_400_000, 10**6, 2_000))
    ttl = db.pttl(keys.rate_window(keys.rate_limit("tpm"), 1000))
    day = now // 86_400_000

    assert reconcile(now + 500, ("tpm", W, 1000, -1_500), ("tpd", 86_400_000, day, -1_500)) == 2
    assert db.get(keys.rate_window(keys.rate_limit("tpm"), 1000)) == b"500"
    assert db.get(keys.rate_window(keys.rate_limit("tpd"), day)) == b"500"
    assert 0 < db.pttl(keys.rate_window(keys.rate_limit("tpm"), 1000)) <= ttl  # the TTL was kept

    assert reconcile(now + 600, ("tpm", W, 1000, 300)) == 1
    assert db.get(keys.rate_window(keys.rate_limit("tpm"), 1000)) == b"800"


def test_reconcile_never_goes_below_zero_nor_recreates_windows(db, admit, reconcile):
    now = WINDOW_START + 1_000
    assert admit(now, ("tpm", "tok", W, 10_000, 100)) == [1]
    assert reconcile(now, ("tpm", W, 1000, -5_000)) == 1
    assert db.get(keys.rate_window(keys.rate_limit("tpm"), 1000)) == b"0"

    # At zero, a charge still lands on the window (with the TTL admission set).
    assert reconcile(now, ("tpm", W, 1000, 40)) == 1
    assert db.get(keys.rate_window(keys.rate_limit("tpm"), 1000)) == b"40"
    assert db.pttl(keys.rate_window(keys.rate_limit("tpm"), 1000)) > 0

    db.delete(keys.rate_window(keys.rate_limit("tpm"), 1000))  # expired
    assert reconcile(now, ("tpm", W, 1000, -50)) == 0
    assert reconcile(now, ("tpm", W, 1000, 50)) == 0
    assert windows(db) == []


def test_reconcile_leaves_windows_that_no_longer_count(db, admit, reconcile):
    assert admit(WINDOW_START, ("tpm", "tok", W, 10_000, 1_000)) == [1]
    two_windows_later = WINDOW_START + 2 * W + 1
    assert reconcile(two_windows_later, ("tpm", W, 1000, -1_000)) == 0
    assert db.get(keys.rate_window(keys.rate_limit("tpm"), 1000)) == b"1000"
