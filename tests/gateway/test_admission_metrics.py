"""The gateway's own /metrics after real traffic through real processes: requests by status
and model, admission decisions by reason, queue waits per class, upstream latency and time to
first token, tokens, and requests in flight per replica.
"""

from __future__ import annotations

import threading

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.accounting import DECISIONS_STREAM, USAGE_STREAM
from gateway.scheduling import keys
from ops.processes import wait_until
from testkit.policy import PolicyBuilder
from testkit.stack import RunningGateway
from tests.conftest import GatewayFactory, SimulatorFactory

MODEL = "llama-test"
P = "switchyard_gateway_"

Sample = tuple[str, dict[str, str], float]


def scrape(gateway: RunningGateway) -> list[Sample]:
    response = httpx.get(gateway.base_url + "/metrics")
    assert response.status_code == 200
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    ]


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    for sample_name, sample_labels, sample_value in samples:
        if sample_name == name and sample_labels == labels:
            return sample_value
    return None


def chat(gateway: RunningGateway, key: str, **extra: object) -> httpx.Response:
    return httpx.post(
        gateway.base_url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        | extra,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def test_metrics_expose_requests_decisions_queue_waits_latencies_tokens_and_in_flight(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_simulator(MODEL)  # 8 ms a token
    replica = sim.base_url
    policy = PolicyBuilder().model(MODEL, [replica], max_in_flight_per_replica=1)
    policy.priority_class("interactive", rank=0)
    key = policy.key(use_case="assistant", priority_class="interactive")
    limited = policy.key(use_case="limited", priority_class="interactive")
    policy.use_case_limits(limited, requests_per_minute=1)
    policy.publish(valkey_client)
    gateway = start_gateway()

    waited: list[httpx.Response] = []
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST",
            gateway.base_url + "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "a long answer please"}],
                "max_tokens": 4000,
                "ignore_eos": True,
                "stream": True,
            },
            headers={"Authorization": f"Bearer {key}"},
        ) as stream,
    ):
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")
        # In flight per replica, while the stream runs.
        assert value(scrape(gateway), P + "in_flight", model=MODEL, replica=replica) == 1
        waiter = threading.Thread(target=lambda: waited.append(chat(gateway, key)))
        waiter.start()
        assert wait_until(lambda: valkey_client.zcard(keys.queue(MODEL)) == 1, timeout=5)
        # This gateway's requests waiting, per queue (the autoscaler's queue-depth signal).
        depth = value(scrape(gateway), P + "queue_depth", model=MODEL, priority_class="interactive")
        assert depth == 1
    # The stream is cut: the waiter gets the slot after a measurable wait.
    waiter.join(timeout=10)
    assert [r.status_code for r in waited] == [200]
    assert chat(gateway, limited).status_code == 200
    refused = chat(gateway, limited)
    assert refused.status_code == 429
    # The decision keeps the Retry-After the client was told (the developer's refusals page).
    told = int(refused.headers["retry-after"])

    def refusals() -> list[dict[bytes, bytes]]:
        return [
            fields
            for _, fields in valkey_client.xrange(DECISIONS_STREAM)
            if fields[b"decision"] == b"rejected"
        ]

    assert wait_until(lambda: len(refusals()) == 1, timeout=5)
    assert int(refusals()[0][b"retry_after_s"]) == told >= 1

    def settled() -> bool:
        samples = scrape(gateway)
        return (
            value(samples, P + "in_flight", model=MODEL, replica=replica) == 0
            and sum(v for n, labels, v in samples if n == P + "requests_total") == 4
        )

    assert wait_until(settled, timeout=5)
    samples = scrape(gateway)
    assert value(samples, P + "queue_depth", model=MODEL, priority_class="interactive") == 0

    # Requests by model and status (four answered; which of them count as 200 is the
    # subject of test_leases_crash_recovery's 499 test).
    by_status = {
        labels["status"]: v
        for n, labels, v in samples
        if n == P + "requests_total" and labels["model"] == MODEL
    }
    assert by_status["429"] == 1
    assert sum(by_status.values()) == 4

    # Admission decisions by reason: the rate-limit refusal and the queue wait.
    decisions = {
        (labels["decision"], labels["reason"]): v
        for n, labels, v in samples
        if n == P + "admission_decisions_total"
    }
    rejected = [reason for (decision, reason) in decisions if decision == "rejected"]
    assert len(rejected) == 1, decisions
    assert rejected[0].startswith("rate_limit"), decisions
    # (At least the waiter; requests granted at once must not count: see the test below.)
    assert decisions[("queued", "interactive")] >= 1

    # Queue wait per class.
    wait_count = value(
        samples, P + "queue_wait_seconds_count", model=MODEL, priority_class="interactive"
    )
    assert wait_count is not None
    assert wait_count >= 1
    assert value(samples, P + "queue_wait_seconds_sum", model=MODEL, priority_class="interactive")

    # Upstream latency and time to first token (the stream, the waiter, the admitted one).
    assert value(samples, P + "upstream_latency_seconds_count", model=MODEL) == 3
    assert value(samples, P + "time_to_first_token_seconds_count", model=MODEL) == 3
    # Tokens by kind.
    assert (value(samples, P + "tokens_total", model=MODEL, kind="prompt") or 0) > 0
    assert (value(samples, P + "tokens_total", model=MODEL, kind="completion") or 0) > 0


def test_decision_metrics_name_the_kind_of_refusal_not_the_tenants_limit(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    """Metric labels must stay bounded (gateway/metrics.py): a rate-limit refusal is counted
    under reason "rate_limit"; the limit's name (which names tenants, use cases and models)
    belongs in the 429's message and in sy:decisions, not in a label."""
    sim = start_simulator(MODEL, "--time-scale", "0")
    policy = PolicyBuilder().model(MODEL, [sim.base_url])
    key = policy.key(tenant="initech", use_case="tps-reports")
    policy.use_case_limits(key, requests_per_minute=1)
    policy.publish(valkey_client)
    gateway = start_gateway()

    assert chat(gateway, key).status_code == 200
    refused = chat(gateway, key)
    assert refused.status_code == 429
    assert "tps-reports" in refused.json()["error"]["message"]

    samples = scrape(gateway)
    assert (
        value(samples, P + "admission_decisions_total", decision="rejected", reason="rate_limit")
        == 1
    )
    leaked = [
        (n, labels)
        for n, labels, _ in samples
        if any("tps-reports" in v or "initech" in v for v in labels.values())
    ]
    assert leaked == []


def test_a_request_granted_at_once_is_not_recorded_as_a_queue_wait(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    """On an idle pool every request is granted by acquire.lua's first answer: that is an
    immediate admission (implied by usage, not written to sy:decisions), not a queue wait —
    however long the round trip to Valkey took."""
    sim = start_simulator(MODEL, "--time-scale", "0")
    policy = PolicyBuilder().model(MODEL, [sim.base_url])  # 64 in flight; one at a time here
    policy.priority_class("interactive", rank=0)
    key = policy.key(priority_class="interactive")
    policy.publish(valkey_client)
    gateway = start_gateway()

    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as client:
        for _ in range(50):
            response = client.post(
                gateway.base_url + "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            )
            assert response.status_code == 200
            assert valkey_client.zcard(keys.queue(MODEL)) == 0  # nobody ever waited
    assert wait_until(lambda: valkey_client.xlen(USAGE_STREAM) == 50, timeout=3)

    decisions = [f[b"decision"].decode() for _, f in valkey_client.xrange(DECISIONS_STREAM)]
    assert decisions == []
    samples = scrape(gateway)
    assert not value(
        samples, P + "queue_wait_seconds_count", model=MODEL, priority_class="interactive"
    )
    assert not [labels for n, labels, _ in samples if n == P + "admission_decisions_total"]
