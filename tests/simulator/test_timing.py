"""The timing model seen from outside: real processes, real sockets, wall-clock time."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ops.processes import wait_until
from testkit.stack import RunningSimulator
from tests.conftest import SimulatorFactory
from tests.simulator.client import OpenStream, get, post

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def gauge(sim: RunningSimulator, name: str, **labels: str) -> float:
    text = get(sim.base_url, "/metrics").body.decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name} {labels}")


def completion(prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, **extra}


def time_to_first_token(sim: RunningSimulator, prompt: str) -> float:
    started = time.monotonic()
    stream = OpenStream(sim.base_url, COMPLETIONS, completion(prompt, 2, stream=True))
    stream.read_event()
    elapsed = time.monotonic() - started
    stream.abandon()
    return elapsed


def test_a_full_batch_makes_requests_wait_and_leaving_clients_free_it(
    start_simulator: SimulatorFactory,
) -> None:
    sim = start_simulator("m", "--max-num-seqs", "2", "--decode-step-ms", "20")
    streams = [
        OpenStream(sim.base_url, COMPLETIONS, completion(f"story {i}", 500, stream=True))
        for i in range(5)
    ]

    assert wait_until(
        lambda: (
            (
                gauge(sim, "vllm:num_requests_running"),
                gauge(sim, "vllm:num_requests_waiting"),
            )
            == (2, 3)
        )
    )
    assert gauge(sim, "vllm:kv_cache_usage_perc") > 0

    for stream in streams:
        stream.abandon()
    assert wait_until(
        lambda: gauge(sim, "vllm:request_success_total", finished_reason="abort") == 5
    )
    assert gauge(sim, "vllm:num_requests_running") == 0
    assert gauge(sim, "vllm:num_requests_waiting") == 0
    assert gauge(sim, "vllm:kv_cache_usage_perc") == 0


def test_a_client_that_leaves_a_non_streaming_request_frees_its_slot(
    start_simulator: SimulatorFactory,
) -> None:
    sim = start_simulator("m", "--max-num-seqs", "1", "--decode-step-ms", "20")
    body = b'{"prompt": "a long answer", "max_tokens": 1000, "ignore_eos": true}'
    with socket.create_connection(("127.0.0.1", sim.port)) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert wait_until(lambda: gauge(sim, "vllm:num_requests_running") == 1)

    assert wait_until(
        lambda: gauge(sim, "vllm:request_success_total", finished_reason="abort") == 1
    )
    assert gauge(sim, "vllm:num_requests_running") == 0
    # The slot is free: a short request is served at once, not after 1000 steps.
    started = time.monotonic()
    assert post(sim.base_url, COMPLETIONS, completion("next", 2)).status == 200
    assert time.monotonic() - started < 1.0


def test_a_longer_prompt_waits_longer_for_its_first_token(
    start_simulator: SimulatorFactory,
) -> None:
    sim = start_simulator("m", "--prefill-tokens-per-s", "4000", "--decode-step-ms", "5")
    short = time_to_first_token(sim, "hello")
    long = time_to_first_token(sim, "lorem ipsum dolor sit amet " * 300)  # ~2000 tokens: 0.5 s
    assert long - short > 0.35


def test_time_scale_stretches_and_shrinks_simulated_time(start_simulator: SimulatorFactory) -> None:
    def duration(*flags: str) -> float:
        sim = start_simulator("m", "--decode-step-ms", "20", *flags)
        started = time.monotonic()
        assert post(sim.base_url, COMPLETIONS, completion("count", 20)).status == 200
        return time.monotonic() - started

    real = duration()
    quarter = duration("--time-scale", "0.25")
    instant = duration("--time-scale", "0")
    assert real >= 0.4  # twenty 20 ms steps
    assert quarter < real / 2
    assert instant < quarter


def test_a_repeated_prompt_hits_the_prefix_cache(start_simulator: SimulatorFactory) -> None:
    sim = start_simulator("m", "--prefill-tokens-per-s", "4000", "--decode-step-ms", "5")
    document = "the quarterly report says " * 300  # ~2000 tokens

    first = time_to_first_token(sim, document)
    hits_before = gauge(sim, "vllm:prefix_cache_hits_total")
    second = time_to_first_token(sim, document + " and one more question")

    assert hits_before == 0
    assert gauge(sim, "vllm:prefix_cache_hits_total") >= 1900
    assert second < first / 2


def test_the_priority_policy_serves_urgent_queued_requests_first(
    start_simulator: SimulatorFactory,
) -> None:
    sim = start_simulator(
        "m", "--scheduling-policy", "priority", "--max-num-seqs", "1", "--decode-step-ms", "10"
    )
    blocker = OpenStream(sim.base_url, COMPLETIONS, completion("blocker", 150, stream=True))
    blocker.read_event()
    finished: list[str] = []

    def ask(name: str, priority: int) -> None:
        reply = post(sim.base_url, COMPLETIONS, completion(name, 3, priority=priority))
        assert reply.status == 200
        finished.append(name)

    with ThreadPoolExecutor(2) as pool:
        lazy = pool.submit(ask, "lazy", 10)
        assert wait_until(lambda: gauge(sim, "vllm:num_requests_waiting") == 1)
        urgent = pool.submit(ask, "urgent", -1)
        assert wait_until(lambda: gauge(sim, "vllm:num_requests_waiting") == 2)
        lazy.result(timeout=10)
        urgent.result(timeout=10)
    blocker.abandon()

    assert finished == ["urgent", "lazy"]


def test_fcfs_ignores_priority(start_simulator: SimulatorFactory) -> None:
    sim = start_simulator("m", "--max-num-seqs", "1", "--decode-step-ms", "10")
    blocker = OpenStream(sim.base_url, COMPLETIONS, completion("blocker", 150, stream=True))
    blocker.read_event()
    finished: list[str] = []

    def ask(name: str, priority: int) -> None:
        assert post(sim.base_url, COMPLETIONS, completion(name, 3, priority=priority)).status == 200
        finished.append(name)

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(ask, "first", 10)
        assert wait_until(lambda: gauge(sim, "vllm:num_requests_waiting") == 1)
        second = pool.submit(ask, "second", -1)
        assert wait_until(lambda: gauge(sim, "vllm:num_requests_waiting") == 2)
        first.result(timeout=10)
        second.result(timeout=10)
    blocker.abandon()

    assert finished == ["first", "second"]
