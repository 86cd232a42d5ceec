"""Groundedness by logprobs through a real gateway, against whatever serves the chat model:
the simulator in the normal suite, a real vLLM on the CPU under ``make test-live``
(tests/live/run.sh sets SWITCHYARD_LIVE_VLLM_URL and runs this file, as it runs the
simulator's contract tests). So nothing here depends on what the model says: thresholds are
chosen at the extremes (every token below -1e-9 — a real model is never that sure of 16
tokens running; none below -100), and the answer is checked for its shape, not its words.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import valkey

from testkit.guardrail_service import GuardrailServiceFactory
from testkit.policy import PolicyBuilder
from tests.conftest import GatewayFactory, SimulatorFactory
from tests.simulator.conftest import LIVE_MODEL, LIVE_URL, SIMULATED_MODEL

CHAT = "/v1/chat/completions"
MODEL = LIVE_MODEL if LIVE_URL else SIMULATED_MODEL
ANY_DOUBT = {"method": "logprobs", "min_logprob": -1e-9, "min_span_tokens": 1}
NO_DOUBT = {"method": "logprobs", "min_logprob": -100.0, "min_span_tokens": 1}
QUESTION = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "The library opens at nine and closes at five."},
        {"role": "user", "content": "When does the library open?"},
    ],
    "max_tokens": 16,
    "temperature": 0,
    "ignore_eos": True,
}


@pytest.fixture
def world(
    valkey_client: valkey.Valkey,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
    start_guardrail_service: GuardrailServiceFactory,
):
    if LIVE_URL:
        replica = LIVE_URL.rstrip("/")
    else:
        replica = start_simulator(MODEL, "--time-scale", "0", "--max-model-len", "2048").base_url
    policy = PolicyBuilder()
    policy.model(MODEL, [replica], capabilities=("chat", "completions"))
    keys = {
        "doubtful": policy.key(use_case="rag-doubtful"),
        "sure": policy.key(use_case="rag-sure"),
        "plain": policy.key(use_case="plain"),
    }
    policy.guardrail(
        keys["doubtful"], "groundedness", side="response", action="block", config=ANY_DOUBT
    )
    policy.guardrail(keys["sure"], "groundedness", side="response", action="flag", config=NO_DOUBT)
    policy.publish(valkey_client)
    service = start_guardrail_service()
    gateway = start_gateway(SWITCHYARD_GUARDRAIL_URL=service.url)

    def post(key: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(
            f"{gateway.base_url}{CHAT}",
            json=body,
            headers={"authorization": f"Bearer {keys[key]}"},
            timeout=120,
        )

    return post


def test_an_answer_with_any_doubt_is_blocked_by_its_own_logprobs(world) -> None:
    refused = world("doubtful", QUESTION)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "guardrail_blocked"
    assert refused.json()["error"]["message"] == (
        "The response was blocked by the 'groundedness' guardrail (low_confidence)."
    )


def test_an_answer_without_doubt_reaches_the_client_without_the_logprobs_it_did_not_ask_for(
    world,
) -> None:
    answer = world("sure", QUESTION)
    assert answer.status_code == 200, answer.text
    (choice,) = answer.json()["choices"]
    assert isinstance(choice["message"]["content"], str)
    assert choice["logprobs"] is None


def test_a_client_that_asked_for_logprobs_keeps_them(world) -> None:
    answer = world("sure", {**QUESTION, "logprobs": True, "top_logprobs": 1})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"] == 16
    assert all(len(entry["top_logprobs"]) == 1 for entry in content)


def test_a_use_case_without_the_option_gets_no_logprobs(world) -> None:
    answer = world("plain", QUESTION)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["logprobs"] is None


def test_a_doubtful_stream_ends_with_the_block_event(world) -> None:
    response = world("doubtful", {**QUESTION, "stream": True})
    assert response.status_code == 200
    events = [
        orjson.loads(block.removeprefix("data: "))
        for block in response.text.split("\n\n")
        if block.startswith("data: ") and block != "data: [DONE]"
    ]
    assert events[-1]["error"]["code"] == "guardrail_blocked"
    content = [c["delta"].get("content") for e in events[:-1] for c in e.get("choices", [])]
    assert all(not text for text in content)  # blocked before any of the answer went out
