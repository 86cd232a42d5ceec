"""The gateway forwards /v1/files and /v1/batches to the web process (gateway/control_proxy.py).

A small HTTP server on loopback stands in for the web process here, recording what reached it
(the SDK against the real web process is tests/scheduler/files/test_openai_batch_sdk.py).
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ops.processes import free_port
from testkit.policy import PolicyBuilder
from tests.gateway.conftest import CHAT


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        Recorder.seen.append(
            {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
        )
        payload = b'{"error": {"message": "busy", "type": "x", "param": null, "code": "c"}}'
        self.send_response(409)
        self.send_header("content-type", "application/json")
        self.send_header("x-should-retry", "false")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def control() -> Iterator[str]:
    Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def key(valkey_client: Any, start_simulator: Any) -> str:
    replica = start_simulator(CHAT, "--time-scale", "0")
    policy = PolicyBuilder().model(CHAT, [replica.base_url])
    secret = policy.key()
    policy.publish(valkey_client)
    return secret


def test_files_and_batches_reach_the_web_process_unchanged(
    key: str, control: str, start_gateway: Any
) -> None:
    gateway = start_gateway(SWITCHYARD_CONTROL_URL=control)
    auth = {"authorization": f"Bearer {key}"}

    answer = httpx.post(
        f"{gateway.base_url}/v1/batches?x=1",
        content=b'{"a": 1}',
        headers={**auth, "x-forwarded-for": "203.0.113.9"},
        timeout=10,
    )
    listed = httpx.get(f"{gateway.base_url}/v1/files/file-1/content", headers=auth, timeout=10)

    assert answer.status_code == 409
    assert answer.headers["x-should-retry"] == "false"
    assert answer.json()["error"]["code"] == "c"
    assert listed.status_code == 409
    first, second = Recorder.seen
    assert (first["method"], first["path"], first["body"]) == (
        "POST",
        "/v1/batches?x=1",
        b'{"a": 1}',
    )
    assert first["headers"]["authorization"] == f"Bearer {key}"
    assert first["headers"]["x-request-id"] == answer.headers["x-request-id"]
    # The gateway is one more hop: it appends the peer it saw.
    assert first["headers"]["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"
    assert (second["method"], second["path"]) == ("GET", "/v1/files/file-1/content")
    # Only the two prefixes go there; the data path is untouched.
    assert httpx.get(f"{gateway.base_url}/v1/filesystem", headers=auth).status_code == 404
    chat = httpx.post(
        f"{gateway.base_url}/v1/chat/completions",
        json={"model": CHAT, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers=auth,
        timeout=10,
    )
    assert chat.status_code == 200
    assert len(Recorder.seen) == 2


def test_a_body_over_the_bound_is_refused_before_it_is_forwarded(
    key: str, control: str, start_gateway: Any
) -> None:
    gateway = start_gateway(
        SWITCHYARD_CONTROL_URL=control, SWITCHYARD_CONTROL_MAX_BODY_BYTES="2048"
    )
    answer = httpx.post(
        f"{gateway.base_url}/v1/files",
        content=b"x" * 4096,
        headers={"authorization": f"Bearer {key}"},
        timeout=10,
    )
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "request_too_large"
    assert Recorder.seen == []


def test_with_the_web_process_down_the_answer_is_a_502_in_openai_shape(
    key: str, start_gateway: Any
) -> None:
    gateway = start_gateway(SWITCHYARD_CONTROL_URL=f"http://127.0.0.1:{free_port()}")
    answer = httpx.get(
        f"{gateway.base_url}/v1/batches", headers={"authorization": f"Bearer {key}"}, timeout=10
    )
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert error["type"] == "server_error"
    assert error["code"] == "control_unreachable"
    assert "web process" in error["message"]
    assert answer.headers["retry-after"] == "5"


def test_a_gateway_told_of_no_web_process_answers_503(key: str, start_gateway: Any) -> None:
    gateway = start_gateway(SWITCHYARD_CONTROL_URL="")
    answer = httpx.post(
        f"{gateway.base_url}/v1/files", headers={"authorization": f"Bearer {key}"}, timeout=10
    )
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "control_not_configured"
