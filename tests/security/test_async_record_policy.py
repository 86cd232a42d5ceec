"""The async door keeps the same record policy and response guardrails as the synchronous one
(issue 24, defect 1).

Real processes: Valkey, the vLLM simulator, the guardrail service (with the test ``words``
detector), a gateway and a batcher. The simulator's ``echo`` starts a chat answer with the
last (assistant) message, so a test chooses what the answer says.

Personas, one use case each: alice keeps ``full`` records, bob ``metadata``, carol ``none``;
dave keeps full records and blocks answers that say "secret"; erin redacts "plan" in answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
import valkey

from gateway.accounting import GUARDRAILS_STREAM, RECORDS_STREAM, USAGE_STREAM
from gateway.async_tasks import layout
from ops.processes import wait_until
from testkit.guardrail_service import GuardrailServiceFactory, start_guardrail_service
from testkit.policy import PolicyBuilder
from testkit.stack import RunningGateway
from tests.conftest import BatcherFactory, GatewayFactory, SimulatorFactory

__all__ = ["start_guardrail_service"]

MODEL = "llama-async-records"


@dataclass
class World:
    gateway: RunningGateway
    valkey: valkey.Valkey
    keys: dict[str, str]

    def headers(self, who: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.keys[who]}"}

    def chat(self, who: str, answer: str) -> httpx.Response:
        """The synchronous chat whose answer starts with ``answer``."""
        return httpx.post(
            self.gateway.base_url + "/v1/chat/completions",
            json=_echoed(answer),
            headers=self.headers(who),
            timeout=30,
        )

    def async_chat(self, who: str, answer: str) -> dict[str, Any]:
        """The same chat as an async task, once it has ended (the poll's document)."""
        submitted = httpx.post(
            self.gateway.base_url + "/v1/async/chat/completions",
            json=_echoed(answer),
            headers=self.headers(who),
            timeout=30,
        )
        assert submitted.status_code == 202, submitted.text
        task_id = submitted.json()["id"]
        ended: dict[str, Any] = {}

        def done() -> bool:
            polled = httpx.get(
                f"{self.gateway.base_url}/v1/tasks/{task_id}?wait=5",
                headers=self.headers(who),
                timeout=30,
            )
            assert polled.status_code == 200, polled.text
            ended.update(polled.json())
            return ended["status"] in ("done", "failed", "expired")

        assert wait_until(done, timeout=60), ended
        return ended


def _echoed(answer: str) -> dict[str, object]:
    return {
        "model": MODEL,
        "max_tokens": 4,
        "echo": True,
        "messages": [
            {"role": "user", "content": "Repeat after me."},
            {"role": "assistant", "content": answer},
        ],
    }


def _entries(client: valkey.Valkey, stream: str, record_id: str) -> list[dict[str, bytes]]:
    return [
        {k.decode(): v for k, v in fields.items()}
        for _, fields in client.xrange(stream)
        if fields.get(b"record_id") == record_id.encode()
    ]


def _usage(client: valkey.Valkey, record_id: str) -> dict[str, bytes]:
    """The request's usage entry, once written (the transcript goes out before it)."""
    assert wait_until(lambda: bool(_entries(client, USAGE_STREAM, record_id)), timeout=15), (
        f"no usage entry for {record_id}"
    )
    [usage] = _entries(client, USAGE_STREAM, record_id)
    return usage


@pytest.fixture
def world(
    valkey_client: valkey.Valkey,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
    start_batcher: BatcherFactory,
    start_guardrail_service: GuardrailServiceFactory,
) -> World:
    chat = start_simulator(MODEL, "--time-scale", "0")
    policy = PolicyBuilder()
    policy.model(MODEL, [chat.base_url])
    policy.priority_class("prod", rank=0).priority_class("batch", rank=4)
    keys = {
        who: policy.key(tenant="acme", use_case=who, priority_class="prod")
        for who in ("alice", "bob", "carol", "dave", "erin")
    }
    policy.record(keys["alice"], "full")
    policy.record(keys["bob"], "metadata")
    policy.record(keys["carol"], "none")
    policy.record(keys["dave"], "full")
    secret: dict[str, object] = {"words": ["secret"]}
    policy.guardrail(keys["dave"], "words", side="response", action="block", config=secret)
    plan: dict[str, object] = {"words": ["plan"], "entity": "PLAN"}
    policy.guardrail(keys["erin"], "words", side="response", action="redact", config=plan)
    policy.record(keys["erin"], "full")
    policy.publish(valkey_client)
    service = start_guardrail_service()
    gateway = start_gateway(SWITCHYARD_GUARDRAIL_URL=service.url)
    start_batcher(SWITCHYARD_GUARDRAIL_URL=service.url)
    return World(gateway, valkey_client, keys)


def test_a_full_use_case_keeps_the_async_chat_as_it_keeps_a_sync_one(world: World) -> None:
    """GIVEN alice's use case keeps full records WHEN she chats synchronously and as a task
    THEN each leaves a transcript with the request as forwarded and the answer she got, and a
    usage entry that says ``full`` under the same record id."""
    sync = world.chat("alice", "The quarterly figures. ")
    assert sync.status_code == 200, sync.text
    sync_id = sync.headers["x-switchyard-record-id"]
    assert _usage(world.valkey, sync_id)["record"] == b"full"
    [sync_entry] = _entries(world.valkey, RECORDS_STREAM, sync_id)

    task = world.async_chat("alice", "The quarterly figures. ")
    assert task["status"] == "done", task
    usage = _usage(world.valkey, task["id"])
    assert usage["record"] == b"full"
    assert usage["request_id"] == task["id"].encode()
    assert usage["endpoint"] == b"/v1/chat/completions"
    [record] = _entries(world.valkey, RECORDS_STREAM, task["id"])
    request = orjson.loads(record["request"])
    assert request["messages"][1]["content"] == "The quarterly figures. "
    assert orjson.loads(record["response"]) == task["result"]
    assert record["response_type"] == b"application/json"
    # Side by side with the synchronous call's transcript: the same kind of record.
    assert orjson.loads(sync_entry["request"])["messages"] == request["messages"]
    assert set(record) == set(sync_entry)


def test_a_metadata_use_case_keeps_no_content_of_a_task(world: World) -> None:
    task = world.async_chat("bob", "Nothing to keep. ")
    assert task["status"] == "done", task
    assert _usage(world.valkey, task["id"])["record"] == b"metadata"
    assert _entries(world.valkey, RECORDS_STREAM, task["id"]) == []


def test_a_none_use_case_keeps_no_record_of_a_task(world: World) -> None:
    task = world.async_chat("carol", "Nothing at all. ")
    assert task["status"] == "done", task
    assert _usage(world.valkey, task["id"])["record"] == b"none"
    assert _entries(world.valkey, RECORDS_STREAM, task["id"]) == []


def test_an_answer_the_sync_path_blocks_is_blocked_as_a_task(world: World) -> None:
    """GIVEN dave's use case blocks answers that say "secret" WHEN the model says it to a
    sync call and to a task THEN both are refused with the guardrail's name (422), the task's
    result is not readable, and the block is recorded as the sync path records it."""
    sync = world.chat("dave", "The secret is out. ")
    assert sync.status_code == 422, sync.text
    assert sync.json()["error"]["code"] == "guardrail_blocked"

    task = world.async_chat("dave", "The secret is out. ")
    assert task["status"] == "failed", task
    assert task["result"] is None
    assert task["error"]["code"] == "guardrail_blocked"
    assert task["error"]["message"] == sync.json()["error"]["message"]
    assert "'words'" in task["error"]["message"]
    usage = _usage(world.valkey, task["id"])
    assert usage["status"] == b"422"
    assert usage["record"] == b"full"
    [record] = _entries(world.valkey, RECORDS_STREAM, task["id"])
    assert b"secret" not in record["response"]
    assert orjson.loads(record["response"])["error"]["code"] == "guardrail_blocked"
    findings = _entries(world.valkey, GUARDRAILS_STREAM, task["id"])
    assert [(f["stage"], f["action"]) for f in findings] == [(b"response", b"blocked")]
    # The result is not left anywhere a poll could read it.
    raw = world.valkey.hgetall(layout.task(task["id"]))
    assert b"secret" not in b"".join(raw.values())


def test_an_answer_the_sync_path_redacts_is_redacted_as_a_task(world: World) -> None:
    sync = world.chat("erin", "The plan is ready. ")
    assert sync.status_code == 200, sync.text
    task = world.async_chat("erin", "The plan is ready. ")
    assert task["status"] == "done", task
    content = task["result"]["choices"][0]["message"]["content"]
    assert content.startswith("The <PLAN> is ready. "), content
    assert sync.json()["choices"][0]["message"]["content"].startswith("The <PLAN> is ready. ")
    assert _usage(world.valkey, task["id"])["record"] == b"full"
    [record] = _entries(world.valkey, RECORDS_STREAM, task["id"])
    assert b"plan" not in record["response"]
