"""Leases end to end: capacity held by a gateway process that dies comes back, and capacity
given back after a normal answer leaves the answer's record intact.

Real gateway and fleet watcher processes, a real Valkey, a real simulator replica.
"""

from __future__ import annotations

import signal
import threading
import time
from functools import partial
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.accounting import USAGE_STREAM
from gateway.scheduling import keys
from ops.processes import wait_until
from testkit.policy import PolicyBuilder
from testkit.stack import RunningGateway
from tests.conftest import GatewayFactory, SimulatorFactory

MODEL = "llama-test"


def chat_body(*, max_tokens: int = 2, **extra: object) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        **extra,
    }


def leases(client) -> list[tuple[bytes, float]]:
    return client.zrange(keys.leases(MODEL), 0, -1, withscores=True)


def queue_is(client, length: int) -> bool:
    return int(client.zcard(keys.queue(MODEL))) == length


def nothing_held(client) -> bool:
    in_flight = client.hgetall(keys.in_flight(MODEL))
    return (
        all(int(v) == 0 for v in in_flight.values())
        and client.zcard(keys.leases(MODEL)) == 0
        and client.zcard(keys.queue(MODEL)) == 0
        and not client.keys(keys.lease("*", MODEL))
    )


def test_a_gateway_killed_while_holding_capacity_gives_it_back_when_its_lease_expires(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_simulator(MODEL)  # 8 ms a token: a 4,000-token stream outlives the test
    policy = PolicyBuilder().model(MODEL, [sim.base_url], max_in_flight_per_replica=1)
    key = policy.key()
    policy.publish(valkey_client)
    doomed = start_gateway(SWITCHYARD_GATEWAY_LEASE_SECONDS="2")
    survivor = start_gateway(SWITCHYARD_GATEWAY_LEASE_SECONDS="2")
    auth = {"Authorization": f"Bearer {key}"}
    outcome: dict[str, Any] = {}

    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST",
            doomed.base_url + "/v1/chat/completions",
            json=chat_body(max_tokens=4000, ignore_eos=True, stream=True),
            headers=auth,
        ) as stream,
    ):
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")
        # The one slot is held by the doomed gateway's lease…
        assert valkey_client.hgetall(keys.in_flight(MODEL)) == {sim.base_url.encode(): b"1"}
        [(_, first_expiry)] = leases(valkey_client)
        # …which it renews while the stream runs (every lease/3).
        assert wait_until(lambda: leases(valkey_client)[0][1] > first_expiry, timeout=3)

        def via_survivor() -> None:
            response = httpx.post(
                survivor.base_url + "/v1/chat/completions", json=chat_body(), headers=auth
            )
            outcome["response"], outcome["at"] = response, time.monotonic()

        waiter = threading.Thread(target=via_survivor, daemon=True)
        waiter.start()
        assert wait_until(lambda: valkey_client.zcard(keys.queue(MODEL)) == 1, timeout=5)

        doomed.process.signal(signal.SIGKILL)  # no release, no cancel: only the lease remains
        killed = time.monotonic()
        assert wait_until(lambda: not doomed.process.alive(), timeout=5)

        waiter.join(timeout=10)
        assert not waiter.is_alive()
    response = outcome["response"]
    assert isinstance(response, httpx.Response)
    assert response.status_code == 200, response.text
    # Not before the lease could have expired (its last renewal was < 2 s before the kill)
    # and within lease + a reaper pass (every second) + slack.
    recovered = outcome["at"] - killed
    assert 0.6 <= recovered <= 5.0, recovered

    # The survivor serves new requests at once, and nothing is left held.
    again = httpx.post(survivor.base_url + "/v1/chat/completions", json=chat_body(), headers=auth)
    assert again.status_code == 200
    assert wait_until(lambda: nothing_held(valkey_client), timeout=3), (
        valkey_client.hgetall(keys.in_flight(MODEL)),
        leases(valkey_client),
    )


def test_a_gateway_killed_with_requests_queued_frees_its_capacity_within_its_heartbeat(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    """GIVEN a gateway holding the only slot on the default 30 s lease, with three requests
    of its own queued ahead of another gateway's, WHEN it is killed (SIGKILL: no release, no
    cancel), THEN its heartbeat expires within seconds, the reaper gives its slot back and
    drops its waiters — none of them is ever granted (nothing is published to its channel,
    no lease names it) — and the survivor's request is served, long before the lease."""
    sim = start_simulator(MODEL)
    policy = PolicyBuilder().model(MODEL, [sim.base_url], max_in_flight_per_replica=1)
    key = policy.key()
    policy.publish(valkey_client)
    doomed = start_gateway()
    survivor = start_gateway()
    auth = {"Authorization": f"Bearer {key}"}
    outcome: dict[str, Any] = {}

    def via(gateway: RunningGateway, name: str) -> None:
        try:
            response = httpx.post(
                gateway.base_url + "/v1/chat/completions",
                json=chat_body(),
                headers=auth,
                timeout=30,
            )
        except httpx.HTTPError as exc:  # the doomed gateway's clients lose their connection
            outcome[name] = exc
        else:
            outcome[name] = response
        outcome[name + "-at"] = time.monotonic()

    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST",
            doomed.base_url + "/v1/chat/completions",
            json=chat_body(max_tokens=4000, ignore_eos=True, stream=True),
            headers=auth,
        ) as stream,
    ):
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")
        [(lease_id, _)] = leases(valkey_client)
        dead_gateway = valkey_client.hget(keys.lease(lease_id.decode(), MODEL), "gw").decode()
        listener = valkey_client.pubsub(ignore_subscribe_messages=True)
        listener.subscribe(keys.gateway_channel(dead_gateway))

        threads = [
            threading.Thread(target=via, args=(doomed, f"doomed-{n}"), daemon=True)
            for n in range(3)
        ]
        for n, thread in enumerate(threads, start=1):
            thread.start()
            assert wait_until(partial(queue_is, valkey_client, n), timeout=5)
        waiter = threading.Thread(target=via, args=(survivor, "survivor"), daemon=True)
        waiter.start()
        assert wait_until(lambda: valkey_client.zcard(keys.queue(MODEL)) == 4, timeout=5)

        doomed.process.signal(signal.SIGKILL)
        killed = time.monotonic()
        assert wait_until(lambda: not doomed.process.alive(), timeout=5)

        waiter.join(timeout=20)
        assert not waiter.is_alive()
    response = outcome["survivor"]
    assert isinstance(response, httpx.Response)
    assert response.status_code == 200, response.text
    # The heartbeat (5 s, last written < 1 s before the kill) and a reaper pass (every
    # second), far from the 30 s lease.
    recovered = outcome["survivor-at"] - killed
    assert 3.0 <= recovered <= 8.0, recovered

    assert listener.get_message(timeout=0.5) is None  # no grant went to the dead gateway
    listener.close()
    for thread in threads:
        thread.join(timeout=5)
        assert not thread.is_alive()
    assert all(isinstance(outcome[f"doomed-{n}"], httpx.HTTPError) for n in range(3))
    assert valkey_client.zscore(keys.gateways(MODEL), dead_gateway) is None
    assert not any(
        valkey_client.hget(info, "gw") == dead_gateway.encode()
        for info in valkey_client.keys(keys.lease("*", MODEL))
    )
    assert wait_until(lambda: nothing_held(valkey_client), timeout=3), (
        valkey_client.hgetall(keys.in_flight(MODEL)),
        leases(valkey_client),
        valkey_client.zrange(keys.queue(MODEL), 0, -1),
    )


def requests_by_status(gateway: RunningGateway) -> dict[str, float]:
    found: dict[str, float] = {}
    text = httpx.get(gateway.base_url + "/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "switchyard_gateway_requests_total":
                found[sample.labels["status"]] = sample.value
    return found


def test_giving_the_lease_back_after_a_full_answer_does_not_turn_it_into_a_499(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    """Capacity is released after the last byte is sent; that release is not the client
    going away: usage and metrics must record the 200 the client got, not 499."""
    sim = start_simulator(MODEL, "--time-scale", "0")
    policy = PolicyBuilder().model(MODEL, [sim.base_url])
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway()
    url = gateway.base_url + "/v1/chat/completions"
    auth = {"Authorization": f"Bearer {key}"}

    statuses = []
    with httpx.Client(timeout=30, headers=auth) as client:  # one kept-alive connection
        statuses += [client.post(url, json=chat_body()).status_code for _ in range(3)]
    statuses += [httpx.post(url, json=chat_body(), headers=auth).status_code for _ in range(3)]
    assert statuses == [200] * 6

    assert wait_until(lambda: valkey_client.xlen(USAGE_STREAM) == 6, timeout=3)
    recorded = [int(f[b"status"]) for _, f in valkey_client.xrange(USAGE_STREAM)]
    assert recorded == [200] * 6, recorded
    assert requests_by_status(gateway) == {"200": 6.0}
    assert wait_until(lambda: nothing_held(valkey_client), timeout=3)
