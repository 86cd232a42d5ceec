"""Priority, backpressure, queue limits and fairness end to end: real gateway and fleet watcher
processes on a real Valkey, in front of real simulator replicas.

Capacity is made scarce on purpose: a model with ``max_in_flight_per_replica`` 1 and a
request held open on it (a stream the test closes when it is ready), or a replica whose own
vLLM queue is filled by requests sent straight to it. What is then observed is what the
gateway did: the order requests finished in (``sy:usage``, written in completion order), the
queue in Valkey, and what each replica received (its own vLLM metrics).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from gateway.accounting import USAGE_STREAM
from gateway.fleet_watcher import ReplicaLoad
from gateway.scheduling import keys
from ops.processes import wait_until
from testkit.policy import PolicyBuilder
from testkit.stack import RunningGateway
from tests.conftest import GatewayFactory, SimulatorFactory

MODEL = "llama-test"
LONG = 4000  # tokens: at the simulator's 8 ms a token, a stream nobody waits out


def body(content: str = "hi", *, max_tokens: int = 2, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        **extra,
    }


def post(
    url: str, payload: dict[str, Any], key: str | None = None, request_id: str | None = None
) -> httpx.Response:
    headers = {}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    return httpx.post(url + "/v1/chat/completions", json=payload, headers=headers, timeout=30)


@contextlib.contextmanager
def holding(url: str, key: str | None = None, **headers: str) -> Iterator[None]:
    """A long stream, running once the first token is in; leaving the block cuts it (the
    gateway then releases its capacity, the replica aborts the sequence)."""
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    payload = body(max_tokens=LONG, ignore_eos=True, stream=True)
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", url + "/v1/chat/completions", json=payload, headers=headers) as r,
    ):
        assert r.status_code == 200, r.read()
        lines = r.iter_lines()  # kept: a dropped generator would close the response
        assert next(lines).startswith("data: ")
        yield


class Background:
    """Requests sent from threads; ``results`` keeps (name, response or exception, finished)."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.results: dict[str, tuple[httpx.Response | Exception, float]] = {}

    def send(self, name: str, request: Callable[[], httpx.Response]) -> None:
        def run() -> None:
            try:
                outcome: httpx.Response | Exception = request()
            except Exception as exc:  # recorded; the test asserts on it
                outcome = exc
            self.results[name] = (outcome, time.monotonic())

        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def join(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "requests still running"

    def status(self, name: str) -> int | str:
        outcome = self.results[name][0]
        return outcome.status_code if isinstance(outcome, httpx.Response) else repr(outcome)


def replica_metrics(url: str) -> dict[str, float]:
    """A replica's vLLM gauges and counters, summed over labels."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def waiting(url: str) -> int:
    return int(replica_metrics(url)["vllm:num_requests_waiting"])


def received(url: str) -> int:
    """Requests the replica has been given: waiting, running, or finished."""
    m = replica_metrics(url)
    return int(
        m["vllm:num_requests_waiting"]
        + m["vllm:num_requests_running"]
        + m["vllm:request_success_total"]
    )


def queued(client) -> int:
    return int(client.zcard(keys.queue(MODEL)))


def finished_order(client) -> list[tuple[str, int]]:
    """(request id, status) of every finished request, in the order they finished."""
    return [
        (fields[b"request_id"].decode(), int(fields[b"status"]))
        for _, fields in client.xrange(USAGE_STREAM)
    ]


def watcher_sees(client, replica: str, at_least: int) -> bool:
    raw = client.hget(keys.fleet(MODEL), replica)
    return raw is not None and ReplicaLoad.decode(raw).waiting >= at_least


# --- priority ---------------------------------------------------------------------------


def test_under_overload_a_prod_request_overtakes_every_queued_dev_request(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_simulator(MODEL, "--max-num-seqs", "1", "--time-scale", "1")
    policy = PolicyBuilder().model(MODEL, [sim.base_url], max_in_flight_per_replica=1)
    policy.priority_class("prod", rank=0).priority_class("dev", rank=2)
    prod = policy.key(tenant="acme", use_case="assistant", priority_class="prod")
    dev = policy.key(tenant="acme", use_case="sandbox", priority_class="dev", environment="dev")
    policy.publish(valkey_client)
    gateway = start_gateway()
    url = gateway.base_url
    devs = 40
    sent = Background()

    with holding(url, dev, **{"X-Request-Id": "holder"}):
        for n in range(devs):
            sent.send(f"dev-{n}", partial(post, url, body(), dev, f"dev-{n}"))
        # The one slot is taken: every dev request waits in the model's queue.
        assert wait_until(lambda: queued(valkey_client) == devs, timeout=15)
        sent.send("prod", partial(post, url, body(), prod, "prod"))
        assert wait_until(lambda: queued(valkey_client) == devs + 1, timeout=5)
    # The holder is cut: the slot frees and the queue drains one request at a time.
    sent.join(timeout=30)
    assert {name: sent.status(name) for name in sent.results} == dict.fromkeys(sent.results, 200)

    # (The clients' statuses are asserted above; sy:usage gives the order they finished in.)
    assert wait_until(lambda: len(finished_order(valkey_client)) == devs + 2, timeout=5)
    order = [request_id for request_id, _ in finished_order(valkey_client)]
    assert order[0] == "holder"
    # Rank beats arrival: prod, which came last, is the first served once the slot frees,
    # ahead of all 40 dev requests that were waiting before it.
    assert order[1] == "prod", order[:5]
    assert sorted(order[2:]) == sorted(f"dev-{n}" for n in range(devs))


def test_a_class_vllm_priority_goes_upstream_to_the_replica(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    """A replica running vLLM's priority scheduler orders its own queue by the ``priority``
    the gateway sent: prod (0) before a direct request of priority 5, dev (10) after it."""
    sim = start_simulator(
        MODEL, "--max-num-seqs", "1", "--scheduling-policy", "priority", "--decode-step-ms", "30"
    )
    policy = PolicyBuilder().model(MODEL, [sim.base_url], max_in_flight_per_replica=8)
    policy.priority_class("prod", rank=0, vllm_priority=0)
    policy.priority_class("dev", rank=1, vllm_priority=10)
    prod = policy.key(tenant="acme", use_case="assistant", priority_class="prod")
    dev = policy.key(tenant="acme", use_case="sandbox", priority_class="dev", environment="dev")
    policy.publish(valkey_client)
    gateway = start_gateway()
    short = body(max_tokens=3, ignore_eos=True)
    sent = Background()

    with holding(sim.base_url):  # straight to the replica: its one sequence slot is busy
        sent.send("direct-5", lambda: post(sim.base_url, {**short, "priority": 5}))
        assert wait_until(lambda: waiting(sim.base_url) == 1, timeout=5)
        sent.send("dev", lambda: post(gateway.base_url, short, dev))
        assert wait_until(lambda: waiting(sim.base_url) == 2, timeout=5)
        sent.send("prod", lambda: post(gateway.base_url, short, prod))
        assert wait_until(lambda: waiting(sim.base_url) == 3, timeout=5)
    sent.join(timeout=15)
    assert {n: sent.status(n) for n in sent.results} == {"direct-5": 200, "dev": 200, "prod": 200}
    by_finish = sorted(sent.results, key=lambda name: sent.results[name][1])
    # FCFS would be direct-5, dev, prod.
    assert by_finish == ["prod", "direct-5", "dev"]


# --- backpressure -----------------------------------------------------------------------


def test_a_replica_with_a_saturated_vllm_queue_gets_nothing_until_it_drains(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    a = start_simulator(MODEL, "--max-num-seqs", "1")
    b = start_simulator(MODEL, "--max-num-seqs", "1")
    policy = PolicyBuilder().model(MODEL, [a.base_url, b.base_url])
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway()
    direct = Background()
    short = body(max_tokens=2)

    with contextlib.ExitStack() as later:
        with holding(a.base_url):
            # Replica a: one sequence running, three waiting in vLLM's own queue (threshold 3).
            for n in range(3):
                direct.send(f"a-{n}", lambda: post(a.base_url, short))
            assert wait_until(lambda: waiting(a.base_url) == 3, timeout=5)
            assert wait_until(lambda: watcher_sees(valkey_client, a.base_url, 3), timeout=5)
            a_before = received(a.base_url)

            # While b has room, everything goes to b, nothing to a.
            for _ in range(4):
                assert post(gateway.base_url, short, key).status_code == 200
            assert received(a.base_url) == a_before
            assert replica_metrics(b.base_url)["vllm:request_success_total"] == 4

            # Now b is saturated too (and stays so): the gateway's request waits in the
            # gateway's queue…
            later.enter_context(holding(b.base_url))
            for n in range(3):
                direct.send(f"b-{n}", lambda: post(b.base_url, short))
            assert wait_until(lambda: waiting(b.base_url) == 3, timeout=5)
            assert wait_until(lambda: watcher_sees(valkey_client, b.base_url, 3), timeout=5)
            b_before = received(b.base_url)
            mine = Background()
            mine.send("gateway", lambda: post(gateway.base_url, short, key))
            assert wait_until(lambda: queued(valkey_client) == 1, timeout=5)
            # …and neither replica is sent anything while both vLLM queues are full.
            assert not wait_until(
                lambda: received(a.base_url) > a_before or received(b.base_url) > b_before,
                timeout=0.6,
            )
            assert "gateway" not in mine.results
        # a's long sequence is cut: its queue moves below the threshold, the waiter goes to a.
        mine.join(timeout=10)
        assert mine.status("gateway") == 200
        assert received(a.base_url) == a_before + 1
        assert received(b.base_url) == b_before
        assert queued(valkey_client) == 0
    direct.join(timeout=10)


class DeepestQueue:
    """The most requests seen waiting in a replica's own vLLM queue, sampled every 10 ms
    from its /metrics while the block runs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.deepest = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                text = client.get(self.url + "/metrics").text
                for family in text_string_to_metric_families(text):
                    for sample in family.samples:
                        if sample.name == "vllm:num_requests_waiting":
                            self.deepest = max(self.deepest, int(sample.value))
                self.samples += 1
                self._stop.wait(0.01)

    def __enter__(self) -> DeepestQueue:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def burst(gateway: RunningGateway, key: str, count: int, max_tokens: int) -> list[int | str]:
    sent = Background()
    payload = body(max_tokens=max_tokens, ignore_eos=True)
    for n in range(count):
        sent.send(f"r{n}", partial(post, gateway.base_url, payload, key))
    sent.join(timeout=60)
    return [sent.status(f"r{n}") for n in range(count)]


def test_a_burst_leaves_a_small_batch_replica_no_deeper_queue_than_the_threshold(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    """GIVEN a replica that runs 2 sequences at a time behind the default cap of 64 in flight
    (threshold 3), WHEN bursts of requests arrive faster than it serves them, THEN once the
    fleet watcher has seen it with a queue (and learned its batch), its own vLLM queue
    never holds more than the threshold: the rest wait in the gateway's queue, in priority
    order, instead of in vLLM's."""
    sim = start_simulator(MODEL, "--max-num-seqs", "2")
    policy = PolicyBuilder().model(MODEL, [sim.base_url])
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway()

    # A burst is what shows the watcher the batch size (nothing could know it before). It
    # learns it only if one of its scrapes falls while two sequences run: on a loaded machine
    # a burst can end between two scrapes, so bursts go on (a few at most) until it has.
    fleet_entry = partial(valkey_client.hget, keys.fleet(MODEL), sim.base_url)

    def learned() -> bool:
        return ReplicaLoad.decode(fleet_entry()).max_running == 2

    for _ in range(5):
        assert burst(gateway, key, 6, max_tokens=40) == [200] * 6
        if wait_until(learned, timeout=2):
            break
    assert learned()

    with DeepestQueue(sim.base_url) as vllm_queue:
        assert burst(gateway, key, 30, max_tokens=16) == [200] * 30

    assert vllm_queue.samples > 20
    assert 1 <= vllm_queue.deepest <= 3, vllm_queue.deepest
    assert wait_until(lambda: queued(valkey_client) == 0, timeout=3)


# --- queue limits -----------------------------------------------------------------------


def one_slot_pool(
    valkey_client,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
    **classes: dict[str, Any],
) -> tuple[RunningGateway, dict[str, str], str]:
    """A model with one replica and one slot; a key per priority class (all rank 0)."""
    sim = start_simulator(MODEL, "--max-num-seqs", "1")
    policy = PolicyBuilder().model(MODEL, [sim.base_url], max_in_flight_per_replica=1)
    for name, settings in classes.items():
        policy.priority_class(name, rank=0, **settings)
    class_keys = {
        name: policy.key(tenant="acme", use_case=name, priority_class=name) for name in classes
    }
    policy.publish(valkey_client)
    return start_gateway(), class_keys, sim.base_url


def waiting_in_class(client, priority_class: str) -> int:
    return int(client.get(keys.queue_length(MODEL, priority_class)) or 0)


def test_a_full_class_queue_turns_the_next_waiter_away_at_once_with_503_queue_full(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    gateway, class_keys, _ = one_slot_pool(
        valkey_client, start_simulator, start_gateway, batch={"max_queue_length": 2}
    )
    key = class_keys["batch"]
    waiters = Background()
    with holding(gateway.base_url, key):
        for n in range(2):
            waiters.send(f"waiter-{n}", lambda: post(gateway.base_url, body(), key))
        assert wait_until(lambda: waiting_in_class(valkey_client, "batch") == 2, timeout=5)
        started = time.monotonic()
        refused = post(gateway.base_url, body(), key)
        assert time.monotonic() - started < 1.0  # refused without waiting
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["code"] == "queue_full"
        assert error["type"] == "service_unavailable"
        assert refused.headers["retry-after"].isdigit()
        assert int(refused.headers["retry-after"]) >= 1
        assert waiting_in_class(valkey_client, "batch") == 2  # it never joined
    waiters.join(timeout=10)
    assert [waiters.status(f"waiter-{n}") for n in range(2)] == [200, 200]


def test_a_waiter_past_its_class_queue_timeout_gets_503_queue_timeout_and_leaves_the_queue(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    gateway, class_keys, _ = one_slot_pool(
        valkey_client,
        start_simulator,
        start_gateway,
        interactive={},
        impatient={"queue_timeout_s": 0.5},
    )
    with holding(gateway.base_url, class_keys["interactive"]):
        started = time.monotonic()
        refused = post(gateway.base_url, body(), class_keys["impatient"])
        waited = time.monotonic() - started
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "queue_timeout"
        assert refused.headers["retry-after"].isdigit()
        assert int(refused.headers["retry-after"]) >= 1
        assert 0.45 <= waited < 2.5
        assert queued(valkey_client) == 0
        assert waiting_in_class(valkey_client, "impatient") == 0


def raw_request(gateway: RunningGateway, key: str, payload: dict[str, Any]) -> socket.socket:
    """Send a request on a bare socket, so the test decides when the client goes away."""
    data = orjson.dumps(payload)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=5)
    sock.sendall(head.encode() + data)
    return sock


def test_a_client_that_disconnects_while_queued_leaves_the_queue_at_once(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    gateway, class_keys, replica = one_slot_pool(
        valkey_client, start_simulator, start_gateway, interactive={}
    )
    key = class_keys["interactive"]
    follower = Background()
    with holding(gateway.base_url, key):
        leaver = raw_request(gateway, key, body())
        assert wait_until(lambda: queued(valkey_client) == 1, timeout=5)
        follower.send("follower", lambda: post(gateway.base_url, body(), key))
        assert wait_until(lambda: queued(valkey_client) == 2, timeout=5)
        leaver.close()
        # The gateway notices the closed connection and takes it out of the queue: no
        # waiting for its queue timeout (30 s) or for a grant.
        assert wait_until(lambda: queued(valkey_client) == 1, timeout=1.0)
        assert waiting_in_class(valkey_client, "interactive") == 1
    # The holder is cut: the slot goes straight to the follower, not to the one that left.
    freed = time.monotonic()
    follower.join(timeout=10)
    assert follower.status("follower") == 200
    assert follower.results["follower"][1] - freed < 2.0
    assert received(replica) == 2  # the holder and the follower: the leaver never got there
    assert wait_until(
        lambda: int(valkey_client.hget(keys.in_flight(MODEL), replica) or 0) == 0, timeout=3
    )


# --- fairness ---------------------------------------------------------------------------

BIG_PROMPT_CHARS = 112_000  # ~28,000 tokens at four characters a token


def test_a_tenant_flooding_28k_token_prompts_does_not_hold_up_a_tenant_sending_short_ones(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    # One slot; a 28k-token prompt takes ~0.56 s to prefill (simulated), a short one ~30 ms.
    sim = start_simulator(
        MODEL,
        "--max-num-seqs", "1",
        "--max-model-len", "40000",
        "--prefill-tokens-per-s", "50000",
    )  # fmt: skip
    policy = PolicyBuilder().model(MODEL, [sim.base_url], max_in_flight_per_replica=1)
    policy.priority_class("standard", rank=0)
    big = policy.key(tenant="bigco", use_case="bulk", priority_class="standard")
    small = policy.key(tenant="smallco", use_case="chat", priority_class="standard")
    policy.publish(valkey_client)
    gateway = start_gateway()
    url = gateway.base_url + "/v1/chat/completions"

    def small_requests(count: int, depths: list[int] | None = None) -> list[float]:
        latencies = []
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {small}"}) as client:
            for n in range(count):
                if depths is not None:
                    depths.append(queued(valkey_client))
                started = time.monotonic()
                response = client.post(url, json=body(f"question {n}", max_tokens=4))
                assert response.status_code == 200, response.text
                latencies.append(time.monotonic() - started)
        return latencies

    baseline = small_requests(5)

    stop = threading.Event()

    def flood(worker: int) -> None:
        filler = "lorem ipsum " * (BIG_PROMPT_CHARS // 12)
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {big}"}) as client:
            n = 0
            while not stop.is_set():
                # A distinct opening each time: no prefix-cache hit makes it cheap.
                content = f"document {worker}-{n}: {filler}"
                try:
                    client.post(url, json=body(content, max_tokens=4))
                except httpx.HTTPError:
                    return  # the gateway was stopped under it: the test is over
                n += 1

    flooders = [threading.Thread(target=flood, args=(w,), daemon=True) for w in range(6)]
    for thread in flooders:
        thread.start()
    try:
        assert wait_until(lambda: queued(valkey_client) >= 4, timeout=10)
        depths: list[int] = []
        flooded = small_requests(5, depths)
    finally:
        stop.set()
        # Abandon bigco's queue rather than wait it out (a graceful stop would drain it).
        gateway.process.signal(signal.SIGKILL)
        for thread in flooders:
            thread.join(timeout=10)

    # bigco's queue was long the whole time: first-come-first-served would have put each
    # small request behind ≥ 3 × 0.56 s of big prompts.
    assert statistics.median(depths) >= 3, depths
    # Fair queueing puts smallco's request next, behind at most the big one in flight.
    assert statistics.median(flooded) <= statistics.median(baseline) + 1.0, (baseline, flooded)
    assert max(flooded) <= max(baseline) + 1.5, (baseline, flooded)


def test_fair_queueing_charges_tokens_so_a_short_burst_overtakes_a_queue_of_28k_token_prompts(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    """Start-time fair queueing is by tokens (docs/gateway-scheduling.md): each 28k-token
    request moves bigco's virtual finish 28k ahead, so three ~25-token requests of smallco
    arriving later all start before bigco's next one. Counting requests instead would
    interleave them one for one with bigco's queue."""
    # Prefill is fast here: what counts is the order, not how long a big prompt takes.
    sim = start_simulator(
        MODEL,
        "--max-num-seqs", "1",
        "--max-model-len", "40000",
        "--prefill-tokens-per-s", "2000000",
    )  # fmt: skip
    policy = PolicyBuilder().model(MODEL, [sim.base_url], max_in_flight_per_replica=1)
    policy.priority_class("standard", rank=0)
    big = policy.key(tenant="bigco", use_case="bulk", priority_class="standard")
    small = policy.key(tenant="smallco", use_case="chat", priority_class="standard")
    policy.publish(valkey_client)
    gateway = start_gateway()
    filler = "lorem ipsum " * (BIG_PROMPT_CHARS // 12)
    sent = Background()

    with holding(gateway.base_url, big, **{"X-Request-Id": "holder"}):
        for n in range(4):
            big_one = body(f"document {n}: {filler}", max_tokens=4)
            sent.send(f"big-{n}", partial(post, gateway.base_url, big_one, big, f"big-{n}"))
        assert wait_until(lambda: queued(valkey_client) == 4, timeout=10)
        for n in range(3):
            small_one = body(f"question {n}", max_tokens=4)
            sent.send(f"small-{n}", partial(post, gateway.base_url, small_one, small, f"small-{n}"))
        assert wait_until(lambda: queued(valkey_client) == 7, timeout=10)
        waiting_order = [
            valkey_client.hget(keys.waiter(member.decode(), MODEL), "tenant").decode()
            for member in valkey_client.zrange(keys.queue(MODEL), 0, -1)
        ]
    sent.join(timeout=30)
    assert {n: sent.status(n) for n in sent.results} == dict.fromkeys(sent.results, 200)

    # While bigco's four big prompts waited, smallco's three short ones queued ahead of them…
    assert waiting_order == ["smallco"] * 3 + ["bigco"] * 4, waiting_order
    # …and were served first once the slot freed.
    assert wait_until(lambda: len(finished_order(valkey_client)) == 8, timeout=5)
    order = [request_id.split("-")[0] for request_id, _ in finished_order(valkey_client)]
    assert order == ["holder"] + ["small"] * 3 + ["big"] * 4, order
