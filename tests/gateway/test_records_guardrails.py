"""Full records keep what the guardrails let through, never the text they took out.

Real processes: the gateway, the guardrail service (with the test ``words`` detector), the
vLLM simulator and Valkey. The simulator's ``echo`` repeats the request's text in the answer,
so a redacted request shows in the response too.

GIVEN alice's use case keeps full records and redacts "secret" WHEN she chats THEN the record
holds the request as forwarded (redacted) and the response as she read it (redacted), and
its record id joins the usage and every guardrail finding of that request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx
import orjson
import pytest
import valkey

from gateway.accounting import GUARDRAILS_STREAM, RECORDS_STREAM, USAGE_STREAM
from testkit.guardrail_service import GuardrailServiceFactory
from testkit.policy import PolicyBuilder
from testkit.stack import RunningGateway
from tests.conftest import GatewayFactory, SimulatorFactory
from tests.gateway.test_records import entries, entry_for

MODEL = "llama-recorded"
SECRET: dict[str, object] = {"words": ["secret"]}


@dataclass
class World:
    gateway: RunningGateway
    valkey: valkey.Valkey
    alice: str

    def chat(self, body: dict[str, object]) -> httpx.Response:
        return httpx.post(
            self.gateway.base_url + "/v1/chat/completions",
            json={"model": MODEL, "max_tokens": 4, **body},
            headers={"authorization": f"Bearer {self.alice}"},
            timeout=30,
        )

    def findings(self, record_id: str) -> list[dict[str, str]]:
        return [
            {k: v.decode() for k, v in e.items()}
            for e in entries(self.valkey, GUARDRAILS_STREAM)
            if e["record_id"] == record_id.encode()
        ]


@pytest.fixture
def start_world(
    valkey_client: valkey.Valkey,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
    start_guardrail_service: GuardrailServiceFactory,
) -> Callable[..., World]:
    def start(
        configure: Callable[[PolicyBuilder, str], None],
        *,
        renamed: bool = False,
    ) -> World:
        policy = PolicyBuilder()
        if renamed:
            # Two deployments serving the model under two names: the body is made at the grant.
            first = start_simulator("llama-a", "--time-scale", "0.01")
            second = start_simulator("llama-b", "--time-scale", "0.01")
            policy.model(
                MODEL,
                [first.base_url, second.base_url],
                deployments=[("llama-a", [first.base_url]), ("llama-b", [second.base_url])],
            )
        else:
            chat = start_simulator(MODEL, "--time-scale", "0.01")
            policy.model(MODEL, [chat.base_url])
        alice = policy.key(use_case="assistant")
        policy.record(alice, "full")
        configure(policy, alice)
        policy.publish(valkey_client)
        service = start_guardrail_service()
        gateway = start_gateway(SWITCHYARD_GUARDRAIL_URL=service.url)
        return World(gateway, valkey_client, alice)

    return start


def echoed(content: str) -> dict[str, object]:
    """A chat whose answer starts with its last (assistant) message: the simulator's echo."""
    return {
        "echo": True,
        "messages": [
            {"role": "user", "content": "Repeat after me."},
            {"role": "assistant", "content": content},
        ],
    }


@pytest.mark.parametrize("renamed", [False, True], ids=["one-name", "renamed-per-replica"])
def test_the_record_keeps_the_redacted_request_and_the_redacted_answer(
    start_world, renamed
) -> None:
    """Also when the body is made at the grant (a model served under two names), where the
    client's own body is never rewritten: the record must not fall back to it."""

    def redact_both(policy: PolicyBuilder, alice: str) -> None:
        policy.guardrail(alice, "words", side="request", action="redact", config=SECRET)
        plan: dict[str, object] = {"words": ["plan"], "entity": "PLAN"}
        policy.guardrail(alice, "words", side="response", action="redact", config=plan)

    world = start_world(redact_both, renamed=renamed)
    response = world.chat(echoed("the secret plan. "))
    assert response.status_code == 200, response.text
    answer = response.json()["choices"][0]["message"]["content"]
    assert answer.startswith("the <WORD> <PLAN>. "), answer
    record_id = response.headers["x-switchyard-record-id"]
    record = entry_for(world.valkey, RECORDS_STREAM, record_id)
    assert record["response"] == response.content
    assert b"secret" not in record["request"]
    assert b"secret" not in record["response"]
    assert b"plan" not in record["response"]
    forwarded = orjson.loads(record["request"])
    assert forwarded["messages"][1]["content"] == "the <WORD> plan. "
    if renamed:
        assert forwarded["model"] in {"llama-a", "llama-b"}  # the granted replica's name
    # The request's findings and usage carry the same record id.
    usage = entry_for(world.valkey, USAGE_STREAM, record_id)
    assert usage["request_id"] == response.headers["x-request-id"].encode()
    found = world.findings(record_id)
    assert sorted((f["stage"], f["action"]) for f in found) == [
        ("request", "redacted"),
        ("response", "redacted"),
    ]
    assert all(f["request_id"] == response.headers["x-request-id"] for f in found)


def test_a_streamed_answer_is_recorded_as_redacted_window_by_window(start_world) -> None:
    def redact_answers(policy: PolicyBuilder, alice: str) -> None:
        policy.guardrail(alice, "words", side="response", action="redact", config=SECRET)

    world = start_world(redact_answers)
    said = "".join(f"line {i} has a secret here. " for i in range(20))
    with httpx.stream(
        "POST",
        world.gateway.base_url + "/v1/chat/completions",
        json={"model": MODEL, "max_tokens": 8, "stream": True, **echoed(said)},
        headers={"authorization": f"Bearer {world.alice}"},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        read = b"".join(response.iter_bytes())
        record_id = response.headers["x-switchyard-record-id"]
    assert b"<WORD>" in read
    assert b"secret" not in read
    assert read.rstrip().endswith(b"data: [DONE]")
    record = entry_for(world.valkey, RECORDS_STREAM, record_id)
    assert record["response"] == read
    [finding] = world.findings(record_id)
    assert (finding["stage"], finding["action"]) == ("response", "redacted")


def test_a_blocked_request_is_recorded_with_the_redactions_that_ran(start_world) -> None:
    """GIVEN "secret" is redacted and "forbidden" blocks WHEN a request holds both THEN the
    client gets 400, and the record keeps the refusal and the request without "secret"."""

    def redact_then_block(policy: PolicyBuilder, alice: str) -> None:
        policy.guardrail(alice, "words", side="request", action="redact", config=SECRET)
        policy.guardrail(
            alice,
            "words",
            side="request",
            action="block",
            config={"words": ["forbidden"], "entity": "BANNED"},
        )

    world = start_world(redact_then_block)
    response = world.chat(echoed("the secret and forbidden plan"))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "guardrail_blocked"
    record_id = response.headers["x-switchyard-record-id"]
    record = entry_for(world.valkey, RECORDS_STREAM, record_id)
    assert record["status"] == b"400"
    assert record["response"] == response.content
    assert b"secret" not in record["request"]
    assert b"<WORD>" in record["request"]
    actions = sorted(f["action"] for f in world.findings(record_id))
    assert actions == ["blocked", "redacted"]


def test_a_request_refused_because_a_redaction_could_not_run_keeps_no_request_text(
    start_world,
) -> None:
    def broken_redaction(policy: PolicyBuilder, alice: str) -> None:
        policy.guardrail(alice, "broken", side="request", action="redact")

    world = start_world(broken_redaction)
    response = world.chat(echoed("the secret plan"))
    assert response.status_code == 503, response.text
    record_id = response.headers["x-switchyard-record-id"]
    record = entry_for(world.valkey, RECORDS_STREAM, record_id)
    assert record["request"] == b""
    assert record["response"] == response.content
    [finding] = world.findings(record_id)
    assert finding["action"] == "failed_closed"
