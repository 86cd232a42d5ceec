"""The fleet watcher against real simulator replicas and a real Valkey.

GIVEN replicas whose /metrics expose vLLM's gauges, the watcher writes each one's load into
``sy:{sy}:fleet:<model>``; a replica it cannot read is written as saturated; data it stops
writing ages visibly; a replica that drains makes it call the pump hook.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace

import pytest
import valkey
import valkey.asyncio as avalkey

from gateway.fleet_settings import FleetSettings
from gateway.fleet_watcher import (
    HEARTBEAT_KEY,
    UNREACHABLE_WAITING,
    FleetWatcher,
    ReplicaLoad,
    WatcherSettings,
    fleet_key,
    now_ms,
    parse_vllm_metrics,
)
from gateway.scheduling import keys
from ops.processes import PYTHON, ManagedProcess, wait_until
from testkit.policy import PolicyBuilder
from tests.conftest import SimulatorFactory

MODEL = "llama-test"
INTERVAL_S = 0.1
TIMEOUT_S = 0.3


def fleet(client: valkey.Valkey, model: str = MODEL) -> dict[str, ReplicaLoad]:
    return {
        field.decode(): ReplicaLoad.decode(value)
        for field, value in client.hgetall(fleet_key(model)).items()
    }


def counts(client: valkey.Valkey, replica: str) -> tuple[int, int]:
    """(waiting, running) as the watcher last wrote them."""
    load = fleet(client)[replica]
    return load.waiting, load.running


def replica_gauges(base_url: str) -> ReplicaLoad:
    """What the replica itself says right now, read without the watcher."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as response:  # noqa: S310
        return parse_vllm_metrics(response.read().decode(), at_ms=now_ms())


class Stream:
    """A long streaming chat request, sent and left running until ``abandon()``."""

    def __init__(self, base_url: str, model: str = MODEL, tokens: int = 4000) -> None:
        host, port = base_url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Tell me a very long story."}],
            "stream": True,
            "max_tokens": tokens,
            "ignore_eos": True,
        }
        # Only sent: a request waiting in vLLM's queue need not have answered yet.
        self.conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )

    def abandon(self) -> None:
        if self.conn.sock is not None:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


@pytest.fixture
def streams() -> Iterator[list[Stream]]:
    opened: list[Stream] = []
    yield opened
    for stream in opened:
        stream.abandon()


@pytest.fixture
def start_watcher(valkey_url: str, valkey_client: valkey.Valkey) -> Iterator:
    started: list[ManagedProcess] = []

    def start(**env: str) -> ManagedProcess:
        process = ManagedProcess(
            "fleet-watcher",
            [PYTHON, "-m", "gateway.fleet_watcher"],
            env={
                "SWITCHYARD_VALKEY_URL": valkey_url,
                "SWITCHYARD_FLEET_SCRAPE_INTERVAL_SECONDS": str(INTERVAL_S),
                "SWITCHYARD_FLEET_SCRAPE_TIMEOUT_SECONDS": str(TIMEOUT_S),
                "SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS": "0.1",
                **env,
            },
        )
        started.append(process)
        process.start(ready=lambda: valkey_client.exists(HEARTBEAT_KEY) == 1, timeout=20)
        return process

    yield start
    for process in started:
        process.stop()


def test_the_fleet_hash_follows_each_replicas_real_gauges(
    valkey_client, start_simulator: SimulatorFactory, start_watcher, streams
) -> None:
    # GIVEN two replicas, one that runs a single sequence at a time
    busy = start_simulator(MODEL, "--max-num-seqs", "1", "--kv-cache-tokens", "8192")
    idle = start_simulator(MODEL)
    PolicyBuilder().model(MODEL, [busy.base_url, idle.base_url]).publish(valkey_client)
    start_watcher()
    assert wait_until(lambda: len(fleet(valkey_client)) == 2, timeout=5)
    assert {(x.waiting, x.running) for x in fleet(valkey_client).values()} == {(0, 0)}

    # WHEN two long streams go to the busy replica: one runs, one waits in vLLM's queue
    streams += [Stream(busy.base_url), Stream(busy.base_url)]

    # THEN the hash shows it, as the replica's own gauges do, and the idle one stays idle
    assert wait_until(lambda: counts(valkey_client, busy.base_url) == (1, 1), timeout=5)
    seen, real = fleet(valkey_client)[busy.base_url], replica_gauges(busy.base_url)
    assert (seen.waiting, seen.running) == (real.waiting, real.running) == (1, 1)
    assert seen.kv_usage > 0
    assert now_ms() - seen.scraped_at_ms < 1000
    assert counts(valkey_client, idle.base_url) == (0, 0)

    # WHEN the clients give up, THEN the replica is seen draining back to idle
    for stream in streams:
        stream.abandon()
    assert wait_until(lambda: counts(valkey_client, busy.base_url) == (0, 0), timeout=5)


def test_a_killed_or_wrong_replica_is_written_as_saturated_within_a_couple_of_intervals(
    valkey_client, start_simulator: SimulatorFactory, start_watcher
) -> None:
    healthy, doomed = start_simulator(MODEL), start_simulator(MODEL)
    not_vllm = healthy.base_url + "/v1"  # answers /v1/metrics with 404
    replicas = [healthy.base_url, doomed.base_url, not_vllm]
    PolicyBuilder().model(MODEL, replicas).publish(valkey_client)
    start_watcher()
    assert wait_until(
        lambda: fleet(valkey_client).get(doomed.base_url, None) is not None, timeout=5
    )
    assert fleet(valkey_client)[doomed.base_url].reachable
    assert not fleet(valkey_client)[not_vllm].reachable

    doomed.process.signal(signal.SIGKILL)
    # Within a couple of intervals on a quiet machine; the bound here only stops a wait that
    # would never end (how soon is the watcher's design, not a timed assertion).
    assert wait_until(lambda: not fleet(valkey_client)[doomed.base_url].reachable, timeout=15)

    load = fleet(valkey_client)[doomed.base_url]
    assert load.waiting == UNREACHABLE_WAITING
    # Stamped with the attempt: fresh, and still never a replica with room.
    assert load.age_ms(now_ms()) < 1000
    assert not load.has_room(now=now_ms(), stale_ms=1000, waiting_threshold=3)
    assert fleet(valkey_client)[healthy.base_url].has_room(
        now=now_ms(), stale_ms=1000, waiting_threshold=3
    )


def test_a_hung_replica_is_saturated_after_the_scrape_timeout_and_others_stay_fresh(
    valkey_client, start_simulator: SimulatorFactory, start_watcher
) -> None:
    healthy, hung = start_simulator(MODEL), start_simulator(MODEL)
    PolicyBuilder().model(MODEL, [healthy.base_url, hung.base_url]).publish(valkey_client)
    start_watcher()
    assert wait_until(lambda: len(fleet(valkey_client)) == 2, timeout=5)

    hung.process.signal(signal.SIGSTOP)  # accepts connections (the kernel does), never answers
    try:
        assert wait_until(lambda: not fleet(valkey_client)[hung.base_url].reachable, timeout=5)
        # The healthy replica is still rewritten at least every timeout + interval.
        for _ in range(5):
            assert fleet(valkey_client)[healthy.base_url].age_ms(now_ms()) < 3 * (
                (INTERVAL_S + TIMEOUT_S) * 1000
            )
            time.sleep(TIMEOUT_S)
    finally:
        hung.process.signal(signal.SIGCONT)
    assert wait_until(lambda: fleet(valkey_client)[hung.base_url].reachable, timeout=5)


def test_stale_data_shows_in_its_timestamp_once_the_watcher_stops(
    valkey_client, start_simulator: SimulatorFactory, start_watcher
) -> None:
    replica = start_simulator(MODEL)
    PolicyBuilder().model(MODEL, [replica.base_url]).publish(valkey_client)
    watcher = start_watcher()
    first = fleet(valkey_client)[replica.base_url]
    assert wait_until(
        lambda: fleet(valkey_client)[replica.base_url].scraped_at_ms > first.scraped_at_ms,
        timeout=2,
    )
    heartbeat = json.loads(valkey_client.get(HEARTBEAT_KEY))
    assert heartbeat["replicas"] == 1
    assert heartbeat["unreachable"] == 0

    # WHEN the watcher is stopped (SIGTERM: a graceful exit)
    assert watcher.stop(timeout=5) == 0
    assert "fleet_watcher_stopped" in watcher.log_text()
    last = fleet(valkey_client)[replica.base_url]
    last_heartbeat = valkey_client.get(HEARTBEAT_KEY)
    time.sleep(5 * INTERVAL_S)

    # THEN the entry stays but nothing refreshes it: its age says it is stale, not idle
    assert fleet(valkey_client)[replica.base_url] == last
    assert last.waiting == 0
    assert last.age_ms(now_ms()) > 4 * INTERVAL_S * 1000
    assert not last.has_room(now=now_ms(), stale_ms=int(2 * INTERVAL_S * 1000), waiting_threshold=3)
    assert valkey_client.get(HEARTBEAT_KEY) == last_heartbeat  # the watcher's health, too


def test_replicas_and_models_dropped_from_the_policy_are_removed(
    valkey_client, start_simulator: SimulatorFactory, start_watcher
) -> None:
    a, b = start_simulator(MODEL), start_simulator(MODEL)
    embed = start_simulator("embed-test", "--kind", "embedding")
    policy = PolicyBuilder().model(MODEL, [a.base_url, b.base_url])
    policy.model("embed-test", [embed.base_url], capabilities=("embeddings",))
    policy.publish(valkey_client)
    # A model left over from before this watcher started (e.g. removed while it was down).
    valkey_client.hset(fleet_key("retired-model"), "http://gone:1", "0|0|0.0|1")
    start_watcher()
    assert wait_until(
        lambda: len(fleet(valkey_client)) == 2 and bool(fleet(valkey_client, "embed-test")),
        timeout=5,
    )
    assert not valkey_client.exists(fleet_key("retired-model"))

    PolicyBuilder().model(MODEL, [a.base_url]).publish(valkey_client)

    assert wait_until(lambda: list(fleet(valkey_client)) == [a.base_url], timeout=5)
    assert wait_until(lambda: not valkey_client.exists(fleet_key("embed-test")), timeout=5)


def test_on_drained_fires_every_cycle_a_replica_has_room_and_never_while_saturated(
    valkey_client, valkey_url: str, start_simulator: SimulatorFactory, streams
) -> None:
    replica = start_simulator(MODEL, "--max-num-seqs", "1")
    PolicyBuilder().model(MODEL, [replica.base_url]).publish(valkey_client)
    drained: list[str] = []

    async def pump(model: str) -> None:
        drained.append(model)

    settings = WatcherSettings(
        fleet=FleetSettings(valkey_url=valkey_url, backpressure_waiting=2),
        scrape_interval_s=INTERVAL_S,
        scrape_timeout_s=TIMEOUT_S,
    )
    with asyncio.Runner() as runner:
        client = avalkey.Valkey.from_url(valkey_url)
        watcher = FleetWatcher(client, settings, on_drained=pump)
        runner.run(watcher.start())
        runner.run(watcher.policy.refresh())
        try:
            # First sight of a replica with room counts: waiters may predate the watcher.
            report = runner.run(watcher.run_cycle())
            assert report.drained == {MODEL}
            assert drained == [MODEL]
            drained.clear()

            # WHEN it saturates (1 running, 2 waiting ≥ threshold) nothing is pumped …
            streams += [Stream(replica.base_url) for _ in range(3)]
            deadline = time.monotonic() + 5
            while runner.run(watcher.run_cycle()).loads[MODEL][replica.base_url].waiting < 2:
                assert time.monotonic() < deadline
            drained.clear()  # pumped while it still had room
            for _ in range(3):
                runner.run(watcher.run_cycle())
            assert drained == []

            # … and once its queue drains below the threshold, the model is pumped again, on
            # every cycle (waiters queued while an entry was stale are not left behind)
            for stream in streams:
                stream.abandon()
            deadline = time.monotonic() + 5
            while not drained:
                runner.run(watcher.run_cycle())
                assert time.monotonic() < deadline
                time.sleep(INTERVAL_S / 2)
            runner.run(watcher.run_cycle())
            assert drained == [MODEL, MODEL]
        finally:
            runner.run(watcher.close())
            runner.run(client.aclose())


def test_a_failing_drained_hook_does_not_stop_the_scraping(
    valkey_client, valkey_url: str, start_simulator: SimulatorFactory
) -> None:
    replica = start_simulator(MODEL)
    PolicyBuilder().model(MODEL, [replica.base_url]).publish(valkey_client)

    async def broken_pump(model: str) -> None:
        raise RuntimeError("pump.lua is not loaded")

    async def scenario() -> None:
        client = avalkey.Valkey.from_url(valkey_url)
        settings = WatcherSettings(
            fleet=FleetSettings(valkey_url=valkey_url), scrape_interval_s=INTERVAL_S
        )
        watcher = FleetWatcher(client, settings, on_drained=broken_pump)
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(stop))
        try:
            await asyncio.sleep(5 * INTERVAL_S)
            assert not task.done()
            assert watcher.last_cycle_at_ms is not None
            assert now_ms() - watcher.last_cycle_at_ms < 1000
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
            await client.aclose()

    asyncio.run(scenario())
    assert fleet(valkey_client)[replica.base_url].reachable


def test_the_load_encoding_round_trips_and_parses_a_real_exposition(
    start_simulator: SimulatorFactory,
) -> None:
    load = ReplicaLoad(waiting=2, running=7, kv_usage=0.4321, scraped_at_ms=1_700_000_000_123)
    assert load.encode() == "2|7|0.4321|1700000000123"
    assert ReplicaLoad.decode(load.encode().encode()) == load
    assert ReplicaLoad.unreachable(5).encode() == f"{UNREACHABLE_WAITING}|0|1.0000|5"

    replica = start_simulator(MODEL)
    real = replica_gauges(replica.base_url)
    assert (real.waiting, real.running, real.kv_usage) == (0, 0, 0.0)


def test_each_entry_carries_the_pools_in_flight_and_the_batch_size_learned(
    valkey_client, start_simulator: SimulatorFactory, start_watcher, streams
) -> None:
    """The two fields that let the scheduler judge vLLM's queue between scrapes: the pool's
    requests in flight on the replica when the scrape began, and the batch size the replica
    showed once it had a queue — kept while it idles and across a watcher restart."""
    replica = start_simulator(MODEL, "--max-num-seqs", "2")
    PolicyBuilder().model(MODEL, [replica.base_url]).publish(valkey_client)
    valkey_client.hset(keys.in_flight(MODEL), replica.base_url, 5)  # what the gateways hold
    watcher = start_watcher()

    def entry() -> ReplicaLoad:
        return fleet(valkey_client)[replica.base_url]

    assert wait_until(lambda: entry().in_flight_at_scrape == 5, timeout=5)
    assert entry().max_running == 0  # never seen with a queue: its batch is not known

    # WHEN one more long stream than it runs goes to it: a queue below the threshold says
    # nothing about its batch (a request between two engine steps waits too)
    streams += [Stream(replica.base_url) for _ in range(3)]
    assert wait_until(lambda: (entry().waiting, entry().running) == (1, 2), timeout=5)
    time.sleep(0.6)  # two more scrapes
    assert entry().max_running == 0
    # WHEN it keeps a queue at the threshold (3) over two scrapes
    streams += [Stream(replica.base_url) for _ in range(2)]
    assert wait_until(lambda: (entry().waiting, entry().running) == (3, 2), timeout=5)
    # THEN its batch is known
    assert wait_until(lambda: entry().max_running == 2, timeout=2)
    raw = valkey_client.hget(fleet_key(MODEL), replica.base_url).decode()
    assert raw.split("|")[4:] == ["5", "2"]

    for stream in streams:
        stream.abandon()
    assert wait_until(lambda: (entry().waiting, entry().running) == (0, 0), timeout=5)
    assert entry().max_running == 2

    # A restarted watcher reads it back instead of forgetting it.
    assert watcher.stop(timeout=5) == 0
    stopped_at = entry().scraped_at_ms
    start_watcher()
    assert wait_until(lambda: entry().scraped_at_ms > stopped_at, timeout=5)
    assert (entry().waiting, entry().max_running) == (0, 2)


def test_the_room_rule_in_python_matches_the_scripts() -> None:
    now = 1_700_000_000_000
    rule = {"now": now, "stale_ms": 1000, "waiting_threshold": 3}
    seen_waiting = ReplicaLoad(2, 4, 0.5, now, in_flight_at_scrape=10, max_running=4)
    assert seen_waiting.has_room(**rule)
    assert seen_waiting.has_room(**rule, in_flight=10)
    assert not seen_waiting.has_room(**rule, in_flight=11)  # granted one since: 3 waiting
    assert seen_waiting.has_room(**rule, in_flight=9)  # released one since
    assert seen_waiting.cap(64, 3) == 7
    assert seen_waiting.cap(5, 3) == 5
    idle = ReplicaLoad(0, 0, 0.0, now, in_flight_at_scrape=0, max_running=4)
    assert idle.has_room(**rule, in_flight=6, policy_cap=64)
    assert not idle.has_room(**rule, in_flight=7, policy_cap=64)
    assert ReplicaLoad.decode(idle.encode()) == idle
    assert idle.encode() == f"0|0|0.0000|{now}|0|4"
    assert ReplicaLoad.decode(f"0|0|0.0000|{now}||4").in_flight_at_scrape is None
    assert ReplicaLoad.decode(f"0|0|0.0000|{now}|1|4|later") == replace(idle, in_flight_at_scrape=1)
