"""Fleet-run guardrails through the whole path: a real gateway asks a guard model and an
embedding model that simulator processes serve, through its own scheduler and fleet client
(the FleetCaller), and enforces their verdicts. The guard model's rule (docs/simulator.md):
a topic is violated when the judged turn holds two of its key words.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import valkey

from testkit.guardrail_service import GuardrailServiceFactory
from testkit.policy import PolicyBuilder
from tests.conftest import GatewayFactory, SimulatorFactory

CHAT = "llama-fleet-guarded"
GUARD = "llama-guard-sim"
EMBED = "minilm-sim"
FINANCE = {
    "name": "financial_advice",
    "description": "Recommendations to buy, sell or hold stocks, bonds or funds.",
}
ASK_STOCKS = "Which stocks should I buy with my bonus?"


@pytest.fixture
def world(
    valkey_client: valkey.Valkey,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
    start_guardrail_service: GuardrailServiceFactory,
):
    chat = start_simulator(CHAT, "--time-scale", "0")
    guard = start_simulator(GUARD, "--kind", "guard", "--time-scale", "0")
    embed = start_simulator(EMBED, "--kind", "embedding", "--time-scale", "0")
    policy = PolicyBuilder()
    policy.model(CHAT, [chat.base_url], capabilities=("chat", "completions"))
    policy.model(GUARD, [guard.base_url], capabilities=("guard",))
    policy.model(EMBED, [embed.base_url], capabilities=("embeddings",))

    def start() -> str:
        policy.publish(valkey_client)
        service = start_guardrail_service()
        return start_gateway(SWITCHYARD_GUARDRAIL_URL=service.url).base_url

    return policy, start, guard


def post(base_url: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{base_url}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )


def test_a_denied_topic_is_blocked_by_the_guard_model_the_fleet_serves(world) -> None:
    """GIVEN a use case denying financial advice through the fleet's guard model
    WHEN a user asks which stocks to buy THEN 400 guardrail_blocked names banned_topics and
    the chat model is never asked; a harmless question goes through."""
    policy, start, _ = world
    key = policy.key(use_case="advisor-bot")
    policy.guardrail(
        key, "banned_topics", side="request", action="block",
        config={"model": GUARD, "topics": [FINANCE]},
    )  # fmt: skip
    base_url = start()

    refused = post(
        base_url, key, {"model": CHAT, "messages": [{"role": "user", "content": ASK_STOCKS}]}
    )
    allowed = post(
        base_url, key, {"model": CHAT, "messages": [{"role": "user", "content": "Hello there"}]}
    )

    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "guardrail_blocked"
    assert "banned_topics" in error["message"]
    assert allowed.status_code == 200, allowed.text


def test_a_guard_model_that_is_gone_fails_closed_with_a_503(world) -> None:
    """GIVEN the guard model's only replica stopped, and the use case failing closed
    WHEN a request needs its verdict THEN 503 guardrail_unavailable, not a pass."""
    policy, start, guard = world
    key = policy.key(use_case="advisor-bot")
    policy.guardrail(
        key, "banned_topics", side="request", action="block",
        config={"model": GUARD, "topics": [FINANCE], "timeout_s": 2},
    )  # fmt: skip
    base_url = start()
    guard.process.stop()

    response = post(base_url, key, {"model": CHAT, "messages": [{"role": "user", "content": "Hi"}]})

    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "guardrail_unavailable"


def test_an_answer_the_request_context_does_not_support_is_refused(world) -> None:
    """GIVEN a RAG use case blocking ungrounded answers, judged with the fleet's embeddings
    WHEN the chat model's answer shares no words with the documents supplied
    THEN 422 guardrail_blocked names groundedness; an answer drawn from them passes."""
    policy, start, _ = world
    key = policy.key(use_case="rag-bot")
    policy.guardrail(
        key, "groundedness", side="response", action="block",
        config={"model": EMBED, "threshold": 0.5},
    )  # fmt: skip
    base_url = start()
    documents = ["The branch in Leeds opens at nine on weekdays and closes at five."]

    def ask(answer: str) -> httpx.Response:
        # With echo, the simulator's chat answer starts with the last assistant message: a
        # known answer (one generated token follows it).
        return post(
            base_url,
            key,
            {
                "model": CHAT,
                "messages": [
                    {"role": "system", "content": documents[0]},
                    {"role": "user", "content": "When does the Leeds branch open?"},
                    {"role": "assistant", "content": answer},
                ],
                "echo": True,
                "max_tokens": 1,
            },
        )

    ungrounded = ask("Penguins migrate across frozen Antarctic glaciers every winter season.")
    grounded = ask("The Leeds branch opens at nine on weekdays.")

    assert ungrounded.status_code == 422, ungrounded.text
    assert "groundedness" in ungrounded.json()["error"]["message"]
    assert grounded.status_code == 200, grounded.text
