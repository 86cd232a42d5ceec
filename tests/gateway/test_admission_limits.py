"""Rate limits end to end: real gateway processes, a real Valkey, real simulator replicas.

GIVEN limits in the policy snapshot, WHEN requests go over them, THEN the gateway answers 429
naming the limit with a Retry-After computed from the window, a refusal costs nothing, one
limit holds across every gateway process sharing the Valkey, and token windows are charged
the estimate at admission and corrected to the real usage afterwards.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter

import httpx

from gateway.scheduling import keys
from ops.processes import wait_until
from testkit.policy import PolicyBuilder
from testkit.stack import RunningGateway
from tests.conftest import GatewayFactory, SimulatorFactory

MODEL = "llama-test"
WINDOW_S = 60


def chat(
    gateway: RunningGateway, key: str, *, max_tokens: int = 2, content: str = "hi", **kw
) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    }
    return httpx.post(
        gateway.base_url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=kw.pop("timeout", 30),
        **kw,
    )


def away_from_the_minute_boundary(margin_s: float) -> None:
    """Rate windows are aligned to wall-clock minutes: start a test that must stay inside one
    window only when at least ``margin_s`` of it is left (waits for the next one otherwise)."""
    if WINDOW_S - time.time() % WINDOW_S < margin_s:
        assert wait_until(lambda: time.time() % WINDOW_S < 1, timeout=margin_s + 1, interval=0.02)


def counted(client, limit_id: str) -> int:
    """What a limit's windows hold now (current and previous window together), in whichever
    slot it lives (gateway/slots.py)."""
    names = client.keys(keys.rate_limit(limit_id, prefix="sy:{sy*}:") + ":*")
    return sum(int(client.get(name) or 0) for name in names)


def test_over_a_use_case_limit_is_a_429_naming_the_limit_with_a_window_computed_retry_after(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_simulator(MODEL, "--time-scale", "0")
    policy = PolicyBuilder().model(MODEL, [sim.base_url])
    two = policy.key(tenant="acme", use_case="two-a-minute")
    six = policy.key(tenant="acme", use_case="six-a-minute")
    policy.use_case_limits(two, requests_per_minute=2)
    policy.use_case_limits(six, requests_per_minute=6)
    policy.publish(valkey_client)
    gateway = start_gateway()
    away_from_the_minute_boundary(margin_s=8)

    answers: dict[str, list[tuple[float, httpx.Response]]] = {two: [], six: []}
    for key, attempts in ((two, 5), (six, 8)):
        for _ in range(attempts):
            answers[key].append((time.time(), chat(gateway, key)))

    for key, allowed, slug in ((two, 2, "two-a-minute"), (six, 6, "six-a-minute")):
        statuses = [r.status_code for _, r in answers[key]]
        # Exactly the allowed number got through, first; every later one was refused…
        assert statuses == [200] * allowed + [429] * (len(statuses) - allowed), statuses
        # …and the refusals were not counted: the window holds just the admitted requests.
        assert counted(valkey_client, f"uc:{policy.use_case_id(key)}:rpm") == allowed
        for sent_at, refused in answers[key][allowed:]:
            error = refused.json()["error"]
            assert error["code"] == "rate_limit_exceeded"
            assert error["type"] == "rate_limit_error"
            assert f"use case {slug} requests per minute" in error["message"]
            retry_after = refused.headers["retry-after"]
            assert retry_after.isdigit(), retry_after
            # The sliding-window estimate (previous window empty) leaves room for one more
            # request once the window has ended and 1/limit of the next one has passed:
            # (W − elapsed) + W/limit — it depends on where in the window we are, and on
            # the limit.
            elapsed = sent_at % WINDOW_S
            expected = math.ceil((WINDOW_S - elapsed) + WINDOW_S / allowed)
            assert abs(int(retry_after) - expected) <= 2, (retry_after, expected)
            assert 1 <= int(retry_after) <= WINDOW_S + WINDOW_S / allowed + 1

    # Not a constant: the tighter limit (2/min) asks for a longer wait than the looser one
    # (6/min), refused within the same second: 60/2 − 60/6 = 20 s apart.
    last_two = int(answers[two][-1][1].headers["retry-after"])
    last_six = int(answers[six][-1][1].headers["retry-after"])
    assert 17 <= last_two - last_six <= 23, (last_two, last_six)
    # And the window's position counts: later refusals of one key never ask for more.
    first_two = int(answers[two][2][1].headers["retry-after"])
    assert last_two <= first_two


def test_a_request_rate_limit_holds_across_three_gateway_processes(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    limit = 15
    sim = start_simulator(MODEL, "--time-scale", "0")
    policy = PolicyBuilder().model(MODEL, [sim.base_url])
    keys_ = [policy.key(tenant="acme", use_case=f"app-{n}") for n in range(3)]
    policy.rate_limits.append(
        {
            "name": "acme-rpm",
            "scope": "tenant",
            "model": None,
            "tenant": "acme",
            "requests_per_minute": limit,
            "tokens_per_minute": None,
            "tokens_per_day": None,
        }
    )
    policy.publish(valkey_client)
    gateways = [start_gateway() for _ in range(3)]
    away_from_the_minute_boundary(margin_s=10)

    statuses: Counter[int] = Counter()
    refusals: list[httpx.Response] = []
    lock = threading.Lock()
    start = threading.Barrier(12)

    def hammer(gateway: RunningGateway, key: str) -> None:
        start.wait(timeout=10)
        with httpx.Client(timeout=30) as client:
            for _ in range(4):
                response = client.post(
                    gateway.base_url + "/v1/chat/completions",
                    json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                    headers={"Authorization": f"Bearer {key}"},
                )
                with lock:
                    statuses[response.status_code] += 1
                    if response.status_code == 429:
                        refusals.append(response)

    threads = [
        threading.Thread(target=hammer, args=(gateways[n % 3], keys_[n % 3])) for n in range(12)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)

    assert sum(statuses.values()) == 48
    assert set(statuses) <= {200, 429}, statuses
    assert limit - 1 <= statuses[200] <= limit + 1, statuses
    assert statuses[429] == 48 - statuses[200]
    assert all("tenant acme requests per minute" in r.json()["error"]["message"] for r in refusals)
    assert counted(valkey_client, "p:acme-rpm:rpm") == statuses[200]


def test_a_token_limit_charges_the_estimate_at_admission_and_reconciles_to_real_usage(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    # Every answer is held back 0.8 s, so a request stays in flight long enough to look at.
    sim = start_simulator(MODEL, "--time-scale", "0", "--fault-slow-first-byte-ms", "800")
    policy = PolicyBuilder().model(MODEL, [sim.base_url])
    key = policy.key(tenant="acme", use_case="summariser")
    policy.use_case_limits(key, tokens_per_minute=2000)
    policy.publish(valkey_client)
    gateway = start_gateway()
    limit_id = f"uc:{policy.use_case_id(key)}:tpm"
    away_from_the_minute_boundary(margin_s=10)

    # A huge max_tokens: the estimate is ~1,500 tokens, the simulated model says < 260.
    results: list[httpx.Response] = []
    first = threading.Thread(target=lambda: results.append(chat(gateway, key, max_tokens=1500)))
    first.start()
    assert wait_until(lambda: counted(valkey_client, limit_id) > 0, timeout=5)
    estimate = counted(valkey_client, limit_id)
    assert 1500 < estimate < 1600  # body chars / 4 + max_tokens, charged up front

    # While it runs its estimate holds the window: a second one would overflow 2,000.
    refused = chat(gateway, key, max_tokens=1500)
    assert refused.status_code == 429
    assert "use case summariser tokens per minute" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"].isdigit()
    assert counted(valkey_client, limit_id) == estimate  # the refusal cost nothing

    first.join(timeout=10)
    assert [r.status_code for r in results] == [200]
    usage = results[0].json()["usage"]
    real = usage["prompt_tokens"] + usage["completion_tokens"]
    assert real < 400
    # Reconciled: the window now holds what the request really used…
    assert wait_until(lambda: counted(valkey_client, limit_id) == real, timeout=3)
    # …which leaves room for the same big request again.
    again = chat(gateway, key, max_tokens=1500)
    assert again.status_code == 200, again.text
    usage = again.json()["usage"]
    assert wait_until(
        lambda: (
            counted(valkey_client, limit_id)
            == real + usage["prompt_tokens"] + usage["completion_tokens"]
        ),
        timeout=3,
    )
