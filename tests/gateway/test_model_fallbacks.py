"""Fallbacks and degradation by class at a real gateway (issue 27; docs/models.md,
"Fallbacks"): a model that refuses for capacity before any byte is out hands the request to
the use case's fallback; under a burst the dev class moves to the small model while prod keeps
the large one.

One stack for the module (testkit/module_stack.py): Valkey, four simulator replicas, each
under its own served name so that an answer's ``model`` says which one wrote it — ``large``
(real-time decoding, two requests at once), ``small`` (instant), ``broken`` (every answer a
5xx, the simulator's fault injection) and ``short`` (a 64-token context) — a fleet watcher and
a gateway.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
import valkey

from gateway.accounting import DECISIONS_STREAM
from gateway.fallbacks import context_too_long
from ops.processes import wait_until
from testkit.async_tasks import wait_ended
from testkit.module_stack import module_stack
from testkit.policy import PolicyBuilder
from testkit.usage_stream import usage_models

SERVED = {"large": "sim-large", "small": "sim-small", "broken": "sim-broken", "short": "sim-short"}
BURST = 24  # dev requests at once against a large pool of two slots


@dataclass
class World:
    url: str
    dev: str  # dev class, falls back after 50 ms on a saturated pool
    prod: str  # prod class, the same fallbacks, no early degradation
    bare: str  # no fallbacks at all
    narrow: str  # its chain names a model it may not call, first
    valkey: valkey.Valkey


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with module_stack() as stack:
        replicas = {
            "large": stack.simulator(SERVED["large"], "--decode-step-ms", "20"),
            "small": stack.simulator(SERVED["small"], "--time-scale", "0"),
            "broken": stack.simulator(
                SERVED["broken"], "--time-scale", "0", "--fault-error-rate", "1.0"
            ),
            "short": stack.simulator(SERVED["short"], "--time-scale", "0", "--max-model-len", "64"),
        }
        policy = (
            PolicyBuilder()
            .priority_class("prod", rank=0)
            .priority_class("dev", rank=2, degrade_after_s=0.05)
        )
        for name, url in replicas.items():
            policy.model(name, [url], served_name=SERVED[name],
                         max_in_flight_per_replica=2 if name == "large" else None)  # fmt: skip
        everything = list(SERVED)
        dev = policy.key(use_case="dev-bot", models=everything, priority_class="dev")
        prod = policy.key(use_case="prod-bot", models=everything, priority_class="prod")
        bare = policy.key(use_case="bare", models=everything, priority_class="prod")
        narrow = policy.key(use_case="narrow", models=["broken", "small"], priority_class="prod")
        # Governance publishes only models the use case may call; the gateway holds the line
        # anyway, should a snapshot say otherwise.
        policy.fallbacks(narrow, "broken", ["large", "small"])
        for key in (dev, prod):
            policy.fallbacks(key, "large", ["small"])
            policy.fallbacks(key, "broken", ["small"])
            policy.fallbacks(key, "short", ["small"])
        url = stack.gateway(policy)
        stack.batcher()
        yield World(url, dev, prod, bare, narrow, stack.valkey)


def chat(model: str, content: str = "Hi", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8}


def post(world: World, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        world.url + "/v1/chat/completions",
        content=orjson.dumps(body),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        timeout=60,
    )


def served_by(answer: httpx.Response) -> str:
    """The model that served, from the headers, checked against the replica that wrote it."""
    assert answer.status_code == 200, answer.text
    model = answer.headers.get("x-switchyard-served-model")
    replica = answer.json()["model"]
    named = next(name for name, served in SERVED.items() if served == replica)
    assert model in (None, named), (model, replica)
    return named


def usage_model(world: World, answer: httpx.Response) -> bytes:
    [model] = usage_models(world.valkey, answer.headers["x-switchyard-record-id"])
    return model


def test_a_5xx_before_the_first_byte_is_served_by_the_fallback(world: World) -> None:
    """... and the decisions stream says so under the model that refused (what the live
    fleet view counts as fallbacks per second)."""
    answer = post(world, world.dev, chat("broken"))
    assert served_by(answer) == "small"
    assert answer.headers["x-switchyard-served-model"] == "small"
    assert usage_model(world, answer) == b"small"
    record_id = answer.headers["x-switchyard-record-id"].encode()
    [decision] = [
        fields
        for _, fields in world.valkey.xrange(DECISIONS_STREAM)
        if fields.get(b"record_id") == record_id
    ]
    assert (decision[b"decision"], decision[b"model"], decision[b"reason"]) == (
        b"fallback",
        b"broken",
        b"upstream_error:small",
    )


def test_a_stream_falls_back_too_before_its_first_byte(world: World) -> None:
    with httpx.stream(
        "POST",
        world.url + "/v1/chat/completions",
        content=orjson.dumps(chat("broken") | {"stream": True}),
        headers={"authorization": f"Bearer {world.dev}", "content-type": "application/json"},
        timeout=60,
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["x-switchyard-served-model"] == "small"
        body = b"".join(answer.iter_bytes())
    assert SERVED["small"].encode() in body
    assert body.rstrip().endswith(b"data: [DONE]")


def test_a_fallback_the_use_case_may_not_call_is_passed_over(world: World) -> None:
    answer = post(world, world.narrow, chat("broken"))
    assert served_by(answer) == "small"


def test_without_a_fallback_the_replica_error_reaches_the_client(world: World) -> None:
    answer = post(world, world.bare, chat("broken"))
    assert answer.status_code >= 500, answer.text
    assert "x-switchyard-served-model" not in answer.headers


def test_a_prompt_longer_than_the_context_goes_to_the_fallback(world: World) -> None:
    long_prompt = "word " * 200  # past short's 64 tokens, well within small's
    answer = post(world, world.dev, chat("short", long_prompt))
    assert served_by(answer) == "small"
    refused = post(world, world.bare, chat("short", long_prompt))
    assert refused.status_code == 400, refused.text
    assert "maximum context length" in refused.json()["error"]["message"]


def test_another_400_is_relayed_as_it_came_even_with_a_fallback(world: World) -> None:
    """A request the model refuses for what it asks (not for capacity) is the client's to
    fix: the fallback is not asked."""
    answer = post(world, world.dev, chat("short") | {"temperature": -1})
    assert answer.status_code == 400, answer.text
    assert "x-switchyard-served-model" not in answer.headers
    assert "temperature" in answer.text


def test_under_a_burst_dev_moves_to_the_small_model_and_prod_keeps_the_large_one(
    world: World,
) -> None:
    """GIVEN the large model's pool of two slots, prod calling it steadily WHEN 24 dev
    requests arrive at once THEN every request is answered; prod's all on the large model;
    most of dev's on the small one, each after at most its class's 50 ms wait (the pool's
    refusals counted per reason on /metrics)."""
    prod_answers: list[httpx.Response] = []
    stop = threading.Event()

    def prod_loop() -> None:
        while not stop.is_set():
            prod_answers.append(post(world, world.prod, chat("large")))

    prod_threads = [threading.Thread(target=prod_loop) for _ in range(2)]
    for thread in prod_threads:
        thread.start()

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        world.url + "/v1/chat/completions",
                        content=orjson.dumps(chat("large")),
                        headers={
                            "authorization": f"Bearer {world.dev}",
                            "content-type": "application/json",
                        },
                    )
                    for _ in range(BURST)
                )
            )

    try:
        assert wait_until(lambda: len(prod_answers) >= 2, timeout=30)
        dev_answers = asyncio.run(burst())
    finally:
        stop.set()
        for thread in prod_threads:
            thread.join(timeout=60)
    dev = Counter(served_by(answer) for answer in dev_answers)
    prod = Counter(served_by(answer) for answer in prod_answers)
    assert prod == {"large": len(prod_answers)}, prod
    assert dev["small"] >= BURST // 2, dev
    metrics = httpx.get(world.url + "/metrics", timeout=10).text
    assert (
        'switchyard_gateway_fallbacks_total{fallback="small",model="large",'
        'reason="queue_timeout"}' in metrics
    ), [line for line in metrics.splitlines() if "fallbacks_total" in line]


def test_an_async_task_falls_back_in_the_batcher_as_at_the_front_door(world: World) -> None:
    """GIVEN a task queued for the model that answers 5xx WHEN the batcher runs it THEN the
    use case's fallback serves it at once (no retry of the failing model), and its usage
    names the fallback."""
    submitted = httpx.post(
        world.url + "/v1/async/chat/completions",
        content=orjson.dumps(chat("broken")),
        headers={"authorization": f"Bearer {world.dev}", "content-type": "application/json"},
        timeout=30,
    )
    assert submitted.status_code == 202, submitted.text
    task_id = submitted.json()["id"]
    [ended] = wait_ended(world.valkey, [task_id], timeout=60)
    assert ended["status"] == "done", ended
    assert ended["result"]["model"] == SERVED["small"], ended
    assert int(ended["attempts"]) == 0, ended
    assert usage_models(world.valkey, task_id) == [b"small"]


def test_a_context_refusal_is_told_from_other_400s_whatever_its_body() -> None:
    """vLLM's words decide; the client's error keeps vLLM's message when there is one, and a
    body cut short or not JSON still gives a clear error, not a crash."""
    said = b'{"error": {"message": "This model\'s maximum context length is 64 tokens."}}'
    error = context_too_long(said)
    assert error is not None
    assert (error.status, error.code) == (400, "context_length_exceeded")
    assert error.message == "This model's maximum context length is 64 tokens."
    cut = context_too_long(b'{"error": {"message": "This model\'s maximum context length is')
    assert cut is not None
    assert cut.message == "The prompt is too long."
    assert context_too_long(b'{"error": {"message": "temperature must be >= 0"}}') is None
