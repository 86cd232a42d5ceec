"""Request guardrails on an async bulk submit (issue 26): the bodies are checked as one batch
(one bulk call to the guardrail service, the fleet's checks concurrently), with each body's
outcome exactly what checking it alone gives: a block in body k refuses the whole call naming
k and queues nothing; a redaction rewrites body k only; flags are recorded body by body.

Real processes throughout: Valkey, the guardrail service (the test detectors), simulators
serving the models and a guard model, and a gateway. Personas: alice's use case redacts
"secret", flags "maybe" and blocks "forbidden"; bob's use case denies financial advice
through the fleet's guard model; carol's blocks "forbidden" under a 200-token-a-minute limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import httpx
import orjson
import pytest
import valkey

from gateway.async_tasks import layout
from ops.processes import free_port
from testkit.guardrail_service import GuardrailServiceFactory
from testkit.guardrails import recorded_findings
from testkit.policy import PolicyBuilder
from testkit.stack import RunningGuardrailService
from tests.conftest import GatewayFactory, SimulatorFactory

CHAT = "llama-bulk-guarded"
EMBED = "embed-bulk-guarded"
GUARD = "llama-guard-bulk"
PARTITIONS = 4
FINANCE = {
    "name": "financial_advice",
    "description": "Recommendations to buy, sell or hold stocks, bonds or funds.",
}


@dataclass
class World:
    base_url: str
    service: RunningGuardrailService | None
    valkey: valkey.Valkey
    alice: str
    bob: str
    carol: str

    def submit(self, key: str, path: str, bodies: Any) -> httpx.Response:
        return httpx.post(
            self.base_url + path,
            content=orjson.dumps(bodies),
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            timeout=60,
        )

    def queued_bodies(self, model: str) -> dict[str, dict[str, Any]]:
        """Every queued task's body, by task id."""
        found = {}
        for partition in range(PARTITIONS):
            for _, fields in self.valkey.xrange(layout.stream(model, partition)):
                found[fields[b"task"].decode()] = orjson.loads(fields[b"body"])
        return found

    def nothing_queued(self) -> bool:
        return not self.valkey.keys(layout.task("*")) and not self.valkey.keys(layout.depth("*"))

    def findings(self, count: int) -> list[dict[str, str]]:
        """The sy:guardrails entries, once there are ``count`` of them."""
        return recorded_findings(self.valkey, count)

    def service_metric(self, name: str) -> float:
        """One sample of the guardrail service's metrics (0 when absent)."""
        assert self.service is not None
        for line in httpx.get(self.service.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@pytest.fixture
def world(
    valkey_client: valkey.Valkey,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
    start_guardrail_service: GuardrailServiceFactory,
) -> World:
    chat = start_simulator(CHAT, "--time-scale", "0")
    embed = start_simulator(EMBED, "--kind", "embedding", "--time-scale", "0")
    guard = start_simulator(GUARD, "--kind", "guard", "--time-scale", "0")
    policy = PolicyBuilder()
    policy.model(CHAT, [chat.base_url], capabilities=("chat", "completions"))
    policy.model(EMBED, [embed.base_url], capabilities=("embeddings",))
    policy.model(GUARD, [guard.base_url], capabilities=("guard",))
    policy.priority_class("interactive", rank=0)
    policy.priority_class("batch", rank=5, max_pool_share=0.5)
    alice = policy.key(tenant="acme", use_case="indexer", models=[CHAT, EMBED])
    policy.guardrail(alice, "words", side="request", action="redact", config={"words": ["secret"]})
    policy.guardrail(
        alice, "words", side="request", action="flag",
        config={"words": ["maybe"], "entity": "MAYBE"},
    )  # fmt: skip
    policy.guardrail(
        alice, "words", side="request", action="block",
        config={"words": ["forbidden"], "entity": "FORBIDDEN"},
    )  # fmt: skip
    carol = policy.key(tenant="initech", use_case="summaries", models=[EMBED])
    policy.use_case_limits(carol, tokens_per_minute=200)
    policy.guardrail(
        carol, "words", side="request", action="block",
        config={"words": ["forbidden"], "entity": "FORBIDDEN"},
    )  # fmt: skip
    bob = policy.key(tenant="globex", use_case="advisor-bot", models=[CHAT])
    policy.guardrail(
        bob, "banned_topics", side="request", action="block",
        config={"model": GUARD, "topics": [FINANCE]},
    )  # fmt: skip
    policy.publish(valkey_client)
    # Two workers: the bulk is shared out between them.
    service = start_guardrail_service(SWITCHYARD_GUARDRAIL_WORKERS="2")
    gateway = start_gateway(SWITCHYARD_GUARDRAIL_URL=service.url)
    return World(gateway.base_url, service, valkey_client, alice, bob, carol)


def _embed(text: str) -> dict[str, Any]:
    return {"model": EMBED, "input": text}


def test_a_block_in_body_k_refuses_the_bulk_naming_k_and_queues_nothing(world: World) -> None:
    """GIVEN alice's use case blocks "forbidden" WHEN she submits a bulk of 40 bodies whose
    body 27 holds it THEN 400 guardrail_blocked naming body 27 (message and param), nothing
    is queued, and the guardrail service got all 40 bodies in one bulk call."""
    bodies = [_embed(f"ordinary text number {i}") for i in range(40)]
    bodies[27] = _embed("this one is forbidden")

    refused = world.submit(world.alice, "/v1/async/embeddings", bodies)

    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "guardrail_blocked"
    assert error["param"] == "[27]"
    assert error["message"].startswith("Body 27 of the bulk submit:")
    assert "'words' guardrail (FORBIDDEN)" in error["message"]
    assert world.nothing_queued()
    assert world.service_metric("switchyard_guardrail_service_bulk_size_count") == 1
    assert world.service_metric("switchyard_guardrail_service_bulk_size_sum") == 40
    assert (
        world.service_metric(
            'switchyard_guardrail_service_checks_total{outcome="ok",stage="request"}'
        )
        == 40
    )
    # The 40 went to the two workers in a few jobs, not one job a body.
    jobs = world.service_metric("switchyard_guardrail_service_batch_size_count")
    assert 2 <= jobs < 40
    assert world.service_metric("switchyard_guardrail_service_batch_size_sum") == 40
    # The block is recorded once, against the body refused.
    [blocked] = world.findings(1)
    assert (blocked["action"], blocked["entities"]) == ("blocked", '{"FORBIDDEN":1}')


def test_a_redaction_in_body_k_rewrites_body_k_only(world: World) -> None:
    """GIVEN alice's use case redacts "secret" WHEN she submits five completions bodies, body
    2 holding it THEN 202, and the queued bodies are as sent but for body 2's redaction."""
    bodies: list[dict[str, Any]] = [
        {"model": CHAT, "prompt": f"prompt {i} in plain words"} for i in range(5)
    ]
    bodies[2] = {"model": CHAT, "prompt": "the secret plan", "max_tokens": 3}

    accepted = world.submit(world.alice, "/v1/async/completions", bodies)

    assert accepted.status_code == 202, accepted.text
    ids = [task["id"] for task in accepted.json()["data"]]
    queued = world.queued_bodies(CHAT)
    expected = [dict(body) for body in bodies]
    expected[2]["prompt"] = "the <WORD> plan"
    assert [queued[task_id] for task_id in ids] == expected
    assert world.service_metric("switchyard_guardrail_service_bulk_size_count") == 1


def test_flags_are_recorded_body_by_body(world: World) -> None:
    """GIVEN alice's use case flags "maybe" WHEN a bulk of four bodies has it once in body 1
    and three times in body 3 THEN 202 with every body queued as sent, and sy:guardrails has
    one flagged finding for each of those bodies, with its own count and record id."""
    bodies = [
        _embed("nothing here"),
        _embed("maybe once"),
        _embed("nothing either"),
        _embed("maybe, maybe, maybe"),
    ]

    accepted = world.submit(world.alice, "/v1/async/embeddings", bodies)

    assert accepted.status_code == 202, accepted.text
    ids = [task["id"] for task in accepted.json()["data"]]
    queued = world.queued_bodies(EMBED)
    assert [queued[task_id] for task_id in ids] == bodies
    flagged = world.findings(2)
    assert sorted(f["entities"] for f in flagged) == ['{"MAYBE":1}', '{"MAYBE":3}']
    assert {f["action"] for f in flagged} == {"flagged"}
    assert len({f["record_id"] for f in flagged}) == 2
    assert len({f["request_id"] for f in flagged}) == 1  # one call


def test_the_fleets_checks_judge_each_body_of_a_bulk(world: World) -> None:
    """GIVEN bob's use case denies financial advice through the fleet's guard model WHEN he
    submits a bulk of six chat bodies, body 4 asking which stocks to buy THEN 400 naming
    body 4 and banned_topics, nothing queued; the same bulk without it is accepted."""
    bodies = [
        {"model": CHAT, "messages": [{"role": "user", "content": f"Hello number {i}"}]}
        for i in range(6)
    ]
    asking = [*bodies]
    asking[4] = {
        "model": CHAT,
        "messages": [{"role": "user", "content": "Which stocks should I buy with my bonus?"}],
    }

    refused = world.submit(world.bob, "/v1/async/chat/completions", asking)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "guardrail_blocked"
    assert error["param"] == "[4]"
    assert "banned_topics" in error["message"]
    assert world.nothing_queued()

    accepted = world.submit(world.bob, "/v1/async/chat/completions", bodies)
    assert accepted.status_code == 202, accepted.text
    assert len(world.queued_bodies(CHAT)) == 6


def test_the_first_refused_body_is_named_as_checking_in_turn_would(world: World) -> None:
    """GIVEN carol's use case blocks "forbidden" and allows 200 tokens a minute WHEN a bulk
    has a body too large for her limit (body 2) THEN 429 naming body 2, nothing queued; when
    an earlier body (1) is also blocked THEN 400 naming body 1: the bodies before the first
    one refused are checked, as in turn."""
    long = _embed("word " * 400)  # ~500 tokens: over the limit on its own

    limited = world.submit(
        world.carol, "/v1/async/embeddings", [_embed("short"), _embed("fine"), long]
    )
    assert limited.status_code == 429, limited.text
    assert limited.json()["error"]["param"] == "[2]"
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert world.nothing_queued()

    blocked = world.submit(
        world.carol, "/v1/async/embeddings", [_embed("short"), _embed("forbidden"), long]
    )
    assert blocked.status_code == 400, blocked.text
    assert blocked.json()["error"]["param"] == "[1]"
    assert blocked.json()["error"]["code"] == "guardrail_blocked"
    assert world.nothing_queued()


@pytest.mark.parametrize("failure", ["closed", "open"])
def test_a_guardrail_service_that_is_down_decides_by_the_failure_mode(
    failure: Literal["closed", "open"],
    valkey_client: valkey.Valkey,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
) -> None:
    """GIVEN no guardrail service where the gateway looks for one WHEN alice submits a bulk of
    three THEN failing closed: 503 guardrail_unavailable naming body 0, nothing queued;
    failing open: 202, all three queued and a failed_open recorded for each body."""
    embed = start_simulator(EMBED, "--kind", "embedding", "--time-scale", "0")
    policy = PolicyBuilder().model(EMBED, [embed.base_url], capabilities=("embeddings",))
    policy.priority_class("batch", rank=5, max_pool_share=0.5)
    alice = policy.key(tenant="acme", use_case="indexer")
    policy.guardrail(alice, "words", side="request", action="block", config={"words": ["x"]})
    policy.guardrail_failure(alice, failure)
    policy.publish(valkey_client)
    nowhere = f"http://127.0.0.1:{free_port()}"
    gateway = start_gateway(SWITCHYARD_GUARDRAIL_URL=nowhere)
    world = World(gateway.base_url, None, valkey_client, alice, alice, alice)

    answer = world.submit(alice, "/v1/async/embeddings", [_embed(f"text {i}") for i in range(3)])

    if failure == "closed":
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "guardrail_unavailable"
        assert answer.json()["error"]["param"] == "[0]"
        assert world.nothing_queued()
        [entry] = world.findings(1)  # recorded up to the body refused
    else:
        assert answer.status_code == 202, answer.text
        assert len(world.queued_bodies(EMBED)) == 3
        entries = world.findings(3)
        assert len({e["record_id"] for e in entries}) == 3
        entry = entries[0]
    assert (entry["guardrail"], entry["action"]) == ("words", f"failed_{failure}")
