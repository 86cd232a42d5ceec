"""The fleet watcher measures each model's tokens per second from a real simulator's vLLM
counters under load, and publishes it (``sy:{sy}:throughput:<model>``) for the feasibility
model; the answer then says it was measured."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
import valkey

from config.processes import PYTHON, ManagedProcess, wait_until
from gateway.fleet_watcher import HEARTBEAT_KEY, now_ms, parse_vllm_metrics
from scheduler import feasibility
from tests.conftest import SimulatorFactory
from tests.support.policy import PolicyBuilder

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
        peak = seen["capacity"]
        assert wait_until(lambda: measurement(valkey_client)["last"] == 0, timeout=5)
        assert wait_until(lambda: measurement(valkey_client)["rate"] < peak / 2, timeout=10)
        assert measurement(valkey_client)["capacity"] == pytest.approx(peak, rel=0.01)
    finally:
        stop.set()
        watcher.stop()
