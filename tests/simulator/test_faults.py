"""Fault injection: each fault from the command line and switched at runtime."""

from __future__ import annotations

import http.client
import time
from typing import Any

import pytest

from ops.processes import wait_until
from tests.conftest import SimulatorFactory
from tests.simulator.client import Reply, get, post

CHAT = "/v1/chat/completions"
FAST = ("--time-scale", "0")


def ask(base_url: str, *, stream: bool = False, timeout: float = 10, **extra: Any) -> Reply:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "ignore_eos": True,
        "stream": stream,
        **extra,
    }
    return post(base_url, CHAT, body, timeout=timeout)


def set_faults(base_url: str, **faults: Any) -> dict[str, Any]:
    reply = post(base_url, "/sim/faults", faults)
    assert reply.status == 200, reply.body
    body: dict[str, Any] = reply.json()
    return body


def assert_injected_500(reply: Reply) -> None:
    assert reply.status == 500
    error = reply.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("InternalServerError", 500, None)


def test_faults_are_off_by_default_and_readable(start_simulator: SimulatorFactory) -> None:
    sim = start_simulator("m", *FAST)
    assert get(sim.base_url, "/sim/faults").json() == {
        "error_rate": 0.0,
        "hang_rate": 0.0,
        "slow_first_byte_ms": 0.0,
        "die_mid_stream_rate": 0.0,
        "die_after_requests": None,
    }
    assert ask(sim.base_url).status == 200


def test_the_command_line_sets_the_faults(start_simulator: SimulatorFactory) -> None:
    sim = start_simulator(
        "m", *FAST, "--fault-error-rate", "0.25", "--fault-slow-first-byte-ms", "5",
        "--fault-die-after-requests", "100",
    )  # fmt: skip
    faults = get(sim.base_url, "/sim/faults").json()
    assert (faults["error_rate"], faults["slow_first_byte_ms"]) == (0.25, 5.0)
    assert faults["die_after_requests"] == 100


def test_error_rate_answers_500_in_vllms_error_shape(start_simulator: SimulatorFactory) -> None:
    sim = start_simulator("m", *FAST, "--fault-error-rate", "1")
    assert_injected_500(ask(sim.base_url))
    assert_injected_500(ask(sim.base_url, stream=True))


def test_error_rate_can_be_switched_on_and_off_at_runtime(
    start_simulator: SimulatorFactory,
) -> None:
    sim = start_simulator("m", *FAST)
    set_faults(sim.base_url, error_rate=1.0)
    assert_injected_500(ask(sim.base_url))
    set_faults(sim.base_url, error_rate=0.0)
    assert ask(sim.base_url).status == 200


def test_a_partial_error_rate_fails_about_that_fraction(start_simulator: SimulatorFactory) -> None:
    sim = start_simulator("m", *FAST, "--fault-error-rate", "0.5", "--seed", "1")
    statuses = [ask(sim.base_url).status for _ in range(60)]
    assert set(statuses) == {200, 500}
    assert 15 <= statuses.count(500) <= 45


def test_the_same_seed_fails_the_same_requests(start_simulator: SimulatorFactory) -> None:
    def pattern(seed: str) -> list[int]:
        sim = start_simulator("m", *FAST, "--fault-error-rate", "0.5", "--seed", seed)
        return [ask(sim.base_url).status for _ in range(24)]

    first = pattern("7")
    assert pattern("7") == first
    assert pattern("8") != first


def test_reseeding_at_runtime_replays_the_same_faults(start_simulator: SimulatorFactory) -> None:
    sim = start_simulator("m", *FAST)
    set_faults(sim.base_url, error_rate=0.5, seed=3)
    first = [ask(sim.base_url).status for _ in range(16)]
    set_faults(sim.base_url, seed=3)
    assert [ask(sim.base_url).status for _ in range(16)] == first


def test_a_hung_request_never_answers_and_the_replica_stays_up(
    start_simulator: SimulatorFactory,
) -> None:
    sim = start_simulator("m", *FAST, "--fault-hang-rate", "1")
    with pytest.raises(TimeoutError):
        ask(sim.base_url, timeout=0.5)
    assert get(sim.base_url, "/health").status == 200


def test_hangs_can_be_switched_at_runtime(start_simulator: SimulatorFactory) -> None:
    sim = start_simulator("m", *FAST)
    set_faults(sim.base_url, hang_rate=1.0)
    with pytest.raises(TimeoutError):
        ask(sim.base_url, stream=True, timeout=0.5)
    set_faults(sim.base_url, hang_rate=0.0)
    assert ask(sim.base_url).status == 200


def _elapsed(base_url: str) -> float:
    started = time.monotonic()
    assert ask(base_url).status == 200
    return time.monotonic() - started


def test_a_slow_first_byte_delays_the_answer(start_simulator: SimulatorFactory) -> None:
    # A lower bound is the fault's behaviour (load only adds to it); the cleared fault is told
    # apart by a margin no loaded machine spends on one tiny answer.
    sim = start_simulator("m", *FAST, "--fault-slow-first-byte-ms", "3000")
    assert _elapsed(sim.base_url) >= 3.0
    set_faults(sim.base_url, slow_first_byte_ms=0)
    assert _elapsed(sim.base_url) < 3.0


def test_a_slow_first_byte_can_be_set_at_runtime(start_simulator: SimulatorFactory) -> None:
    sim = start_simulator("m", *FAST)
    set_faults(sim.base_url, slow_first_byte_ms=300)
    assert _elapsed(sim.base_url) >= 0.3


def test_a_stream_cut_mid_way_ends_without_its_final_chunk(
    start_simulator: SimulatorFactory,
) -> None:
    sim = start_simulator("m", *FAST, "--fault-die-mid-stream-rate", "1")
    with pytest.raises(http.client.IncompleteRead) as cut:
        ask(sim.base_url, stream=True)
    received = cut.value.partial.decode()
    assert '"content"' in received  # a few tokens made it out first
    assert 'finish_reason":"length' not in received
    assert "[DONE]" not in received
    # Only streams are cut, and the replica lives on.
    assert ask(sim.base_url).status == 200
    assert "without completing response" not in sim.process.log_text()  # cut on purpose: no noise


def test_stream_cuts_can_be_switched_at_runtime(start_simulator: SimulatorFactory) -> None:
    sim = start_simulator("m", *FAST)
    assert ask(sim.base_url, stream=True).events()[-1] == "[DONE]"
    set_faults(sim.base_url, die_mid_stream_rate=1.0)
    with pytest.raises(http.client.IncompleteRead):
        ask(sim.base_url, stream=True)


def test_the_replica_dies_after_n_requests(start_simulator: SimulatorFactory) -> None:
    sim = start_simulator("m", *FAST, "--fault-die-after-requests", "3")
    for _ in range(3):
        assert ask(sim.base_url).status == 200
    assert wait_until(lambda: not sim.process.alive(), timeout=5)
    assert sim.process.proc is not None
    assert sim.process.proc.returncode == 1
    with pytest.raises(ConnectionRefusedError):
        get(sim.base_url, "/health")


def test_death_after_n_requests_can_be_armed_at_runtime(start_simulator: SimulatorFactory) -> None:
    sim = start_simulator("m", *FAST)
    for _ in range(5):
        assert ask(sim.base_url).status == 200
    set_faults(sim.base_url, die_after_requests=2)
    assert ask(sim.base_url).status == 200
    assert sim.process.alive()
    assert ask(sim.base_url, stream=True).events()[-1] == "[DONE]"
    assert wait_until(lambda: not sim.process.alive(), timeout=5)


@pytest.mark.parametrize(
    "body",
    [
        {"error_rate": 2},
        {"hang_rate": "often"},
        {"die_after_requests": 0},
        {"slow_first_byte_ms": -1},
        {"explode": True},
    ],
)
def test_invalid_fault_settings_are_refused(
    start_simulator: SimulatorFactory, body: dict[str, Any]
) -> None:
    sim = start_simulator("m", *FAST)
    reply = post(sim.base_url, "/sim/faults", body)
    assert reply.status == 400
    assert reply.json()["error"]["type"] == "BadRequestError"
    assert get(sim.base_url, "/sim/faults").json()["error_rate"] == 0.0


def test_a_partial_update_keeps_the_other_settings(start_simulator: SimulatorFactory) -> None:
    sim = start_simulator("m", *FAST, "--fault-error-rate", "0.1")
    faults = set_faults(sim.base_url, fault_hang_rate=0.2)
    assert (faults["error_rate"], faults["hang_rate"]) == (0.1, 0.2)
