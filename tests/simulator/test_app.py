"""The ASGI app in-process, as tests and benchmarks elsewhere may embed it: no server, no socket."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from simulator.app import create_app
from simulator.config import SimulatorConfig, parse_args


async def call(app: Any, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request through the app; returns the status and the whole body."""
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop()
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(b"content-type", b"application/json")],
    }
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_the_app_answers_in_process() -> None:
    app = create_app(SimulatorConfig(served_model_names=("inproc",), time_scale=0))
    request = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}

    async def scenario() -> tuple[int, bytes]:
        try:
            return await call(app, "POST", "/v1/chat/completions", json.dumps(request).encode())
        finally:
            await app.simulator.engine.close()

    status, body = asyncio.run(scenario())
    assert status == 200
    answer = json.loads(body)
    assert (answer["model"], answer["usage"]["completion_tokens"]) == ("inproc", 3)


def test_the_config_is_built_from_argv() -> None:
    config = parse_args(
        ["--served-model-name", "a", "b", "--kind", "embedding", "--max-num-seqs", "8",
         "--time-scale", "0.5", "--scheduling-policy", "priority", "--fault-error-rate", "0.1",
         "--fault-die-after-requests", "9", "--seed", "4"]
    )  # fmt: skip
    assert config.served_model_names == ("a", "b")
    assert (config.model_name, config.kind, config.max_num_seqs) == ("a", "embedding", 8)
    assert (config.time_scale, config.scheduling_policy, config.seed) == (0.5, "priority", 4)
    assert (config.faults.error_rate, config.faults.die_after_requests) == (0.1, 9)
    assert config.max_model_len == 8192  # defaults resemble Llama-3.1-8B on one H100
