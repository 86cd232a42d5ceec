"""Only Valkey's clock matters (issue 10, item 12): a gateway or fleet watcher host whose
wall clock is off by seconds must not make replicas look stale, nor a live gateway dead.

The skew is injected in the process under test: its ``time.time`` runs off by a few seconds
(monkeypatched; the hosts' clocks are the one part a test cannot move for real). Valkey, the
replicas and every socket are real. A part that stands for a correct host reads the wall
clock as it was before the patch.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import valkey
import valkey.asyncio as avalkey

from gateway.fleet_settings import FleetSettings
from gateway.fleet_watcher import FleetWatcher, WatcherSettings
from gateway.scheduling import Scheduler, Ticket, fleet_entry, keys, write_fleet
from testkit.policy import PolicyBuilder
from tests.conftest import SimulatorFactory
from tests.gateway.scheduling.conftest import MODEL, R1, running_schedulers

SKEW_S = 2.0
STALE_MS = 1_000  # the gateway's default staleness bound: 2 s of skew is twice over it

_true_time = time.time
_true_time_ns = time.time_ns


def true_ms() -> int:
    """The correct host's clock: the wall clock before any patch (Valkey's, on this host)."""
    return int(_true_time() * 1000)


@pytest.fixture
def skew(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """``skew(seconds)``: this process's wall clock runs that far ahead (negative: behind)."""

    def set_skew(seconds: float) -> None:
        monkeypatch.setattr(time, "time", lambda: _true_time() + seconds)
        monkeypatch.setattr(time, "time_ns", lambda: _true_time_ns() + int(seconds * 1e9))

    return set_skew


def _ticket(request_id: str, replica: str = R1, **changes: object) -> Ticket:
    fields: dict[str, object] = {
        "request_id": request_id,
        "model": MODEL,
        "replicas": ((replica, 4),),
        "rank": 1,
        "priority_class": "prod",
        "queue_timeout_s": 1.0,
        "max_queue_length": 100,
        "tenant": "acme",
        "use_case_id": 12,
    }
    fields.update(changes)
    return Ticket(**fields)  # type: ignore[arg-type]


async def test_a_gateway_whose_clock_runs_ahead_still_finds_fresh_replicas(
    valkey_url, valkey_client, skew
):
    """GIVEN a replica the watcher (a correct clock) saw idle just now, WHEN a gateway whose
    clock runs 2 s ahead asks for it, THEN it is granted at once (not taken as stale)."""
    client = avalkey.Valkey.from_url(valkey_url)
    try:
        skew(SKEW_S)
        async with running_schedulers(valkey_url, stale_ms=STALE_MS) as (gateway,):
            entry = fleet_entry(waiting=0, running=0, kv_usage=0.1, scraped_at_ms=true_ms())
            await write_fleet(client, MODEL, {R1: entry})
            grant = await gateway.acquire(_ticket("ahead"))
        assert grant.replica == R1
        assert not grant.queued
    finally:
        await client.aclose()


async def test_a_watcher_whose_clock_runs_behind_writes_entries_gateways_find_fresh(
    valkey_url, valkey_client, start_simulator: SimulatorFactory, skew
):
    """GIVEN a fleet watcher whose host clock runs 2 s behind, WHEN it scrapes an idle replica
    and a gateway with a correct clock asks for it, THEN the gateway is granted it at once."""
    replica = start_simulator(MODEL)
    PolicyBuilder().model(MODEL, [replica.base_url]).publish(valkey_client)
    watcher_client = avalkey.Valkey.from_url(valkey_url)
    settings = WatcherSettings(fleet=FleetSettings(valkey_url=valkey_url))
    watcher = FleetWatcher(watcher_client, settings)
    await watcher.start()
    try:
        await watcher.policy.refresh()
        skew(-SKEW_S)
        report = await watcher.run_cycle()
        assert report.written
    finally:
        await watcher.close()
        await watcher_client.aclose()

    async with running_schedulers(valkey_url, stale_ms=STALE_MS, clock=true_ms) as (gateway,):
        grant = await gateway.acquire(_ticket("fresh", replica=replica.base_url))
    assert grant.replica == replica.base_url
    assert not grant.queued


async def test_a_gateway_whose_clock_runs_behind_is_not_taken_for_dead(
    valkey_url, valkey_client: valkey.Valkey, skew
):
    """GIVEN a gateway whose clock runs 6 s behind (more than its 5 s heartbeat) holding a
    lease, WHEN a gateway with a correct clock runs the reaper, THEN the lease is kept: the
    heartbeat is judged in the clock it was written in."""
    client = avalkey.Valkey.from_url(valkey_url)
    try:
        entry = fleet_entry(waiting=0, running=0, kv_usage=0.1, scraped_at_ms=true_ms())
        await write_fleet(client, MODEL, {R1: entry})
        skew(-6.0)
        slow = Scheduler(client, gateway_id="gw-slow", stale_ms=60_000)
        await slow.start()
        try:
            grant = await slow.acquire(_ticket("held", queue_timeout_s=5.0))
            async with running_schedulers(valkey_url, clock=true_ms) as (reaper,):
                released, dropped, _ = await reaper.reap()
            assert (released, dropped) == (0, 0)
            assert valkey_client.zscore(keys.leases(MODEL), grant.lease_id) is not None
            assert valkey_client.zscore(keys.gateways(MODEL), "gw-slow") is not None
            await slow.release(grant)
        finally:
            await slow.close()
    finally:
        await client.aclose()
