"""The fleet watcher measures each model's tokens per second from a real simulator's vLLM
counters under load, and publishes it (``sy:{sy}:throughput:<model>``) for the feasibility
model; the answer then says it was measured."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
import valkey
import valkey.asyncio as avalkey

from gateway.fleet_settings import FleetSettings
from gateway.fleet_watcher import (
    HEARTBEAT_KEY,
    FleetWatcher,
    ReplicaLoad,
    ThroughputMeter,
    WatcherSettings,
    now_ms,
    parse_vllm_metrics,
)
from ops.processes import PYTHON, ManagedProcess, wait_until
from scheduler.files import feasibility
from testkit.policy import PolicyBuilder
from tests.conftest import SimulatorFactory

MODEL = "feas-test"


def counted_tokens(base_url: str) -> float:
    """Prompt plus generation tokens the replica's own counters say it processed."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as response:  # noqa: S310
        tokens = parse_vllm_metrics(response.read().decode(), at_ms=now_ms()).tokens
    assert tokens is not None
    return tokens


def chat(base_url: str, stop: threading.Event) -> None:
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Summarise this page, please."}],
            "max_tokens": 64,
            "ignore_eos": True,
        }
    ).encode()
    while not stop.is_set():
        request = urllib.request.Request(  # noqa: S310
            base_url + "/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            response.read()


@pytest.fixture
def load() -> Iterator[list[threading.Thread]]:
    threads: list[threading.Thread] = []
    yield threads
    for thread in threads:
        thread.join(timeout=30)


def measurement(client: valkey.Valkey) -> dict[str, float]:
    raw = client.hgetall(feasibility.throughput_key(MODEL))
    return {k.decode(): float(v) for k, v in raw.items()}


def test_the_watcher_publishes_a_models_measured_throughput(
    valkey_client: valkey.Valkey, valkey_url: str, start_simulator: SimulatorFactory
) -> None:
    replica = start_simulator(MODEL, "--max-num-seqs", "8")
    PolicyBuilder().model(MODEL, [replica.base_url]).publish(valkey_client)
    watcher = ManagedProcess(
        "fleet-watcher",
        [PYTHON, "-m", "gateway.fleet_watcher"],
        env={
            "SWITCHYARD_VALKEY_URL": valkey_url,
            "SWITCHYARD_FLEET_SCRAPE_INTERVAL_SECONDS": "0.1",
            "SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS": "0.1",
            "SWITCHYARD_FLEET_THROUGHPUT_INTERVAL_SECONDS": "1.0",
        },
    )
    stop = threading.Event()
    threads = [threading.Thread(target=chat, args=(replica.base_url, stop)) for _ in range(4)]
    watcher.start(ready=lambda: valkey_client.exists(HEARTBEAT_KEY) == 1, timeout=20)
    try:
        # Before any load: nothing measured yet, so the feasibility model uses its default.
        settings = feasibility.CapacitySettings(share=0.5, default_tokens_per_second=10.0)
        rate, measured = feasibility.batch_rate(valkey_client, MODEL, settings, now=time.time())
        assert not measured or measurement(valkey_client)["capacity"] == 0

        # WHEN four clients keep the replica busy
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        before, started = counted_tokens(replica.base_url), time.monotonic()
        time.sleep(4.0)
        actual = (counted_tokens(replica.base_url) - before) / (time.monotonic() - started)
        assert actual > 0

        # THEN the hash carries a rate close to what the replica's own counters say
        seen = measurement(valkey_client)
        assert seen["replicas"] == 1
        assert 0.5 * actual <= seen["last"] <= 2 * actual, (seen, actual)
        assert 0.5 * actual <= seen["rate"] <= 2 * actual, (seen, actual)
        assert seen["capacity"] >= seen["last"]
        rate, measured = feasibility.batch_rate(valkey_client, MODEL, settings, now=time.time())
        assert measured
        assert rate == pytest.approx(seen["capacity"] * 0.5)

        # WHEN the load stops, the smoothed rate falls but the capacity is remembered
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        assert wait_until(lambda: measurement(valkey_client)["last"] == 0, timeout=5)
        # The peak as the last loaded interval left it (one may end after ``seen`` was read;
        # the capacity also decays, by its day-long half-life, a hair a second).
        peak = measurement(valkey_client)["capacity"]
        assert peak >= seen["capacity"] * 0.99
        assert wait_until(lambda: measurement(valkey_client)["rate"] < peak / 2, timeout=10)
        assert measurement(valkey_client)["capacity"] == pytest.approx(peak, rel=0.01)
    finally:
        stop.set()
        watcher.stop()


def load_with(tokens: float | None) -> ReplicaLoad:
    return ReplicaLoad(0, 1, 0.1, 0, tokens=tokens)


def test_the_meter_sums_replicas_and_ignores_restarts_and_newcomers() -> None:
    meter = ThroughputMeter(interval_s=1.0, alpha=0.5, half_life_s=10.0)
    assert meter.observe("m", {"a": load_with(100), "b": load_with(1000)}, 0) is None
    # Less than an interval: no sample yet, the counters are kept from the start.
    assert meter.observe("m", {"a": load_with(150), "b": load_with(1100)}, 500) is None
    first = meter.observe("m", {"a": load_with(300), "b": load_with(1300)}, 2000)
    assert first is not None
    assert float(first["last"]) == 250.0  # (200 + 300) tokens over 2 s
    assert float(first["rate"]) == 250.0  # the first measurement is taken as it is
    assert float(first["capacity"]) == 250.0
    # a restarted (its counter went down), c is new, d cannot be read: only b counts.
    replicas = {
        "a": load_with(10),
        "b": load_with(1500),
        "c": load_with(5000),
        "d": ReplicaLoad.unreachable(4000),
    }
    second = meter.observe("m", replicas, 4000)
    assert second is not None
    assert float(second["last"]) == 100.0
    assert float(second["rate"]) == 175.0  # EWMA: half of 100, half of 250
    # The capacity remembers 250, decayed over 2 s of a 10 s half-life.
    assert float(second["capacity"]) == pytest.approx(250 * 0.5 ** (2 / 10), abs=0.001)
    assert second["replicas"] == "3"


def test_a_restored_meter_goes_on_from_the_published_figures() -> None:
    meter = ThroughputMeter(interval_s=1.0, alpha=0.5, half_life_s=1e9)
    meter.restore("m", rate=100.0, capacity=400.0)
    assert meter.observe("m", {"a": load_with(0)}, 0) is None
    sample = meter.observe("m", {"a": load_with(50)}, 1000)
    assert sample is not None
    assert float(sample["rate"]) == 75.0  # smoothed with the restored rate
    assert float(sample["capacity"]) == pytest.approx(400.0)


def test_a_restarted_watcher_keeps_the_capacity_it_published(
    valkey_client: valkey.Valkey, valkey_url: str, start_simulator: SimulatorFactory
) -> None:
    """GIVEN a capacity published by an earlier watcher WHEN a new one measures an idle
    replica THEN the capacity stays (decayed slowly), and only the last rate is zero."""
    replica = start_simulator(MODEL)
    PolicyBuilder().model(MODEL, [replica.base_url]).publish(valkey_client)
    valkey_client.hset(
        feasibility.throughput_key(MODEL),
        mapping={"rate": "100", "capacity": "400", "last": "90", "replicas": "1", "at_ms": "1"},
    )
    fleet = FleetSettings(valkey_url=valkey_url)
    settings = WatcherSettings(fleet=fleet, throughput_interval_s=0.1)
    with asyncio.Runner() as runner:
        client = avalkey.Valkey.from_url(valkey_url)
        watcher = FleetWatcher(client, settings, on_drained=None)
        runner.run(watcher.start())
        runner.run(watcher.policy.refresh())
        try:
            runner.run(watcher.run_cycle())
            time.sleep(0.2)
            runner.run(watcher.run_cycle())
        finally:
            runner.run(watcher.close())
            runner.run(client.aclose())
    seen = measurement(valkey_client)
    assert seen["last"] == 0
    assert seen["rate"] == pytest.approx(70.0)  # 0.3 × 0 + 0.7 × 100
    assert seen["capacity"] == pytest.approx(400.0, rel=0.001)
