"""Groundedness by logprobs through the whole path: a real gateway asks the simulator's chat
model for token logprobs only for use cases whose groundedness check reads them, flags or
blocks spans of unsure tokens, and hands the client the answer it would have had.

The simulator's rule (docs/simulator.md, simulator/logprobs.py): a token whose word the prompt
holds is confident, any other is unsure. A prompt holding the whole vocabulary gets a clean
answer; a prompt holding almost nothing gets one long unsure span. What the simulator answers
directly, asked the same body, is the reference for what the client must see.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
import valkey

from gateway.accounting import GUARDRAILS_STREAM
from gateway.guardrail_plan import plan_guardrails
from gateway.guardrails.fleet import Answered, FleetCheckFailed, ask_logprobs, run_fleet_check
from guardrails import confidence
from guardrails.catalogue import validate_selection
from guardrails.engine import Check, Summary
from simulator.tokens import VOCABULARY
from testkit.async_tasks import wait_ended
from testkit.guardrail_service import GuardrailServiceFactory
from testkit.guardrails import recorded_findings
from testkit.policy import PolicyBuilder
from testkit.stack import RunningSimulator
from tests.conftest import BatcherFactory, GatewayFactory, SimulatorFactory

CHAT_MODEL = "llama-logprobs"
EMBED = "minilm-sim"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EVERY_WORD = " ".join(VOCABULARY)
MIN_LOGPROB, MIN_SPAN = -2.0, 3
UNSURE = {"method": "logprobs", "min_logprob": MIN_LOGPROB, "min_span_tokens": MIN_SPAN}


@dataclass
class World:
    base_url: str
    chat: RunningSimulator
    valkey: valkey.Valkey

    def post(self, key: str, body: dict[str, Any], path: str = CHAT) -> httpx.Response:
        return httpx.post(
            f"{self.base_url}{path}",
            json=body,
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
        )

    def direct(self, body: dict[str, Any], path: str = CHAT) -> dict[str, Any]:
        """What the simulator answers the same body, asked without the gateway."""
        reply = httpx.post(f"{self.chat.base_url}{path}", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        answer: dict[str, Any] = reply.json()
        return answer

    def findings(self, count: int) -> list[dict[str, str]]:
        """The sy:guardrails entries, once there are ``count`` of them."""
        return recorded_findings(self.valkey, count)


@pytest.fixture
def world(
    valkey_client: valkey.Valkey,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
    start_guardrail_service: GuardrailServiceFactory,
    start_batcher: BatcherFactory,
):
    chat = start_simulator(CHAT_MODEL, "--time-scale", "0")
    embed = start_simulator(EMBED, "--kind", "embedding", "--time-scale", "0")
    policy = PolicyBuilder()
    policy.model(CHAT_MODEL, [chat.base_url], capabilities=("chat", "completions"))
    policy.model(EMBED, [embed.base_url], capabilities=("embeddings",))

    def start(batcher: bool = False) -> World:
        policy.publish(valkey_client)
        service = start_guardrail_service()
        gateway = start_gateway(SWITCHYARD_GUARDRAIL_URL=service.url)
        if batcher:
            start_batcher(SWITCHYARD_GUARDRAIL_URL=service.url)
        return World(gateway.base_url, chat, valkey_client)

    return policy, start


def rag(system: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": CHAT_MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Go."}],
        "max_tokens": 16,
        "ignore_eos": True,
        **extra,
    }


def test_an_answer_with_a_span_of_unsure_tokens_is_blocked(world) -> None:
    """GIVEN a use case blocking low-confidence answers WHEN the model is unsure of most of
    its words (the prompt holds few of them) THEN 422 guardrail_blocked names groundedness,
    and the finding counts the low_confidence spans, never their text."""
    policy, start = world
    key = policy.key(use_case="rag-bot")
    policy.guardrail(key, "groundedness", side="response", action="block", config=UNSURE)
    w = start()

    tokens = confidence.choice_tokens(
        w.direct(rag("Be brief.", logprobs=True))["choices"][0]["logprobs"]
    )
    assert tokens is not None
    expected = confidence.spans(tokens, MIN_LOGPROB, MIN_SPAN)

    refused = w.post(key, rag("Be brief."))

    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "guardrail_blocked"
    assert "groundedness" in error["message"]
    assert "low_confidence" in error["message"]
    [entry] = w.findings(1)
    assert (entry["guardrail"], entry["action"]) == ("groundedness", "blocked")
    assert orjson.loads(entry["entities"]) == {"low_confidence": len(expected)}
    assert float(entry["score"]) > 0.9  # e^-2.5 and below: a probability under 0.09
    assert "".join(span.text for span in expected) not in "".join(entry.values())


def test_a_flagged_answer_counts_each_span_and_reaches_the_client_without_logprobs(
    world,
) -> None:
    """GIVEN flag WHEN the answer holds unsure spans THEN the client gets the answer the
    simulator gives a request without logprobs (choice for choice), and one finding counts
    the spans that the simulator's own logprobs show."""
    policy, start = world
    key = policy.key(use_case="rag-bot")
    policy.guardrail(key, "groundedness", side="response", action="flag", config=UNSURE)
    w = start()
    # Some words held, some not: several spans, known from the simulator's logprobs.
    body = rag(" ".join(VOCABULARY[::3]), seed=11)
    tokens = confidence.choice_tokens(
        w.direct({**body, "logprobs": True})["choices"][0]["logprobs"]
    )
    assert tokens is not None
    expected = confidence.spans(tokens, MIN_LOGPROB, MIN_SPAN)
    assert expected, "the prompt was chosen to leave unsure spans"

    answer = w.post(key, body)

    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"] == w.direct(body)["choices"]
    [entry] = w.findings(1)
    assert (entry["guardrail"], entry["action"]) == ("groundedness", "flagged")
    assert orjson.loads(entry["entities"]) == {"low_confidence": len(expected)}
    assert float(entry["score"]) == max(span.score for span in expected)
    for span in expected:
        assert span.text not in "".join(entry.values())


def test_an_async_task_is_judged_by_its_logprobs_as_a_request_is(world) -> None:
    """GIVEN flag WHEN the same body is submitted as an async task THEN the batcher asks for
    logprobs too: its result is the answer without them, and the one finding counts the
    spans the simulator's own logprobs show."""
    policy, start = world
    key = policy.key(use_case="rag-bot")
    policy.guardrail(key, "groundedness", side="response", action="flag", config=UNSURE)
    w = start(batcher=True)
    body = rag(" ".join(VOCABULARY[::3]), seed=11)
    tokens = confidence.choice_tokens(
        w.direct({**body, "logprobs": True})["choices"][0]["logprobs"]
    )
    assert tokens is not None
    expected = confidence.spans(tokens, MIN_LOGPROB, MIN_SPAN)
    assert expected, "the prompt was chosen to leave unsure spans"
    headers = {"authorization": f"Bearer {key}"}

    submitted = httpx.post(
        f"{w.base_url}/v1/async/chat/completions", json=body, headers=headers, timeout=30
    )
    assert submitted.status_code == 202, submitted.text
    [ended] = wait_ended(w.valkey, [submitted.json()["id"]], timeout=60)
    assert ended["status"] == "done", ended
    assert ended["result"]["choices"] == w.direct(body)["choices"]
    assert ended["result"]["choices"][0]["logprobs"] is None
    [entry] = w.findings(1)
    assert (entry["guardrail"], entry["action"]) == ("groundedness", "flagged")
    assert orjson.loads(entry["entities"]) == {"low_confidence": len(expected)}


def test_a_clean_answer_passes_with_no_finding(world) -> None:
    policy, start = world
    key = policy.key(use_case="rag-bot")
    policy.guardrail(key, "groundedness", side="response", action="block", config=UNSURE)
    w = start()

    answer = w.post(key, rag(EVERY_WORD))

    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"] == w.direct(rag(EVERY_WORD))["choices"]
    assert answer.json()["choices"][0]["logprobs"] is None
    assert w.valkey.xlen(GUARDRAILS_STREAM) == 0


def test_a_client_that_asked_for_logprobs_gets_them_as_the_model_gave_them(world) -> None:
    policy, start = world
    key = policy.key(use_case="rag-bot")
    policy.guardrail(key, "groundedness", side="response", action="flag", config=UNSURE)
    w = start()
    body = rag(EVERY_WORD, logprobs=True, top_logprobs=2)

    answer = w.post(key, body)

    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"] == w.direct(body)["choices"]
    assert len(answer.json()["choices"][0]["logprobs"]["content"]) == 16


def test_use_cases_without_the_option_send_no_logprobs_upstream(world) -> None:
    """GIVEN one use case checking groundedness by embeddings and one with no guardrails
    WHEN their clients ask without logprobs THEN their answers carry none: the simulator
    returns logprobs whenever it is asked, and nothing takes them out for these use cases,
    so the gateway did not ask."""
    policy, start = world
    embedding = policy.key(use_case="rag-embeddings")
    policy.guardrail(
        embedding, "groundedness", side="response", action="flag", config={"model": EMBED}
    )
    plain = policy.key(use_case="plain-bot")
    w = start()

    for key in (embedding, plain):
        answer = w.post(key, rag(EVERY_WORD))
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["logprobs"] is None
        assert answer.json()["choices"] == w.direct(rag(EVERY_WORD))["choices"]


def test_both_methods_run_the_embedding_and_the_logprob_checks(world) -> None:
    """GIVEN method both WHEN the answer shares no words with the context and is unsure
    THEN both kinds of finding are counted in the one summary."""
    policy, start = world
    key = policy.key(use_case="rag-bot")
    policy.guardrail(
        key, "groundedness", side="response", action="flag",
        config={**UNSURE, "method": "both", "model": EMBED, "min_claim_chars": 0},
    )  # fmt: skip
    w = start()

    answer = w.post(key, rag("Penguins."))

    assert answer.status_code == 200, answer.text
    [entry] = w.findings(1)
    assert set(orjson.loads(entry["entities"])) == {"ungrounded", "low_confidence"}


def test_a_completion_is_judged_by_its_token_logprobs_too(world) -> None:
    policy, start = world
    key = policy.key(use_case="rag-bot")
    policy.guardrail(key, "groundedness", side="response", action="block", config=UNSURE)
    w = start()
    body = {"model": CHAT_MODEL, "prompt": "Go.", "max_tokens": 12, "ignore_eos": True}

    refused = w.post(key, body, COMPLETIONS)
    clean = w.post(key, {**body, "prompt": EVERY_WORD}, COMPLETIONS)

    assert refused.status_code == 422, refused.text
    assert clean.status_code == 200, clean.text
    assert (
        clean.json()["choices"] == w.direct({**body, "prompt": EVERY_WORD}, COMPLETIONS)["choices"]
    )


def stream_events(response: httpx.Response) -> list[dict[str, Any]]:
    events = []
    for block in response.text.split("\n\n"):
        if block.startswith("data: ") and block != "data: [DONE]":
            events.append(orjson.loads(block.removeprefix("data: ")))
    return events


def test_a_stream_with_an_unsure_span_ends_with_a_block_event(world) -> None:
    policy, start = world
    key = policy.key(use_case="rag-bot")
    policy.guardrail(key, "groundedness", side="response", action="block", config=UNSURE)
    w = start()

    response = w.post(key, rag("Be brief.", stream=True))

    assert response.status_code == 200
    events = stream_events(response)
    assert events[-1]["error"]["code"] == "guardrail_blocked"
    assert "groundedness" in events[-1]["error"]["message"]


def test_a_clean_stream_carries_the_answer_and_no_logprobs(world) -> None:
    """GIVEN a stream the check passes THEN the text is the simulator's answer, no event
    carries logprobs the client did not ask for, and nothing is recorded."""
    policy, start = world
    key = policy.key(use_case="rag-bot")
    policy.guardrail(key, "groundedness", side="response", action="block", config=UNSURE)
    w = start()

    response = w.post(key, rag(EVERY_WORD, stream=True))

    events = stream_events(response)
    assert all("error" not in e for e in events)
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert text == w.direct(rag(EVERY_WORD))["choices"][0]["message"]["content"]
    assert all(c["logprobs"] is None for e in events for c in e["choices"])
    assert w.valkey.xlen(GUARDRAILS_STREAM) == 0


def test_a_long_stream_judges_spans_across_its_windows(world) -> None:
    """GIVEN an answer far longer than the 512-character window, unsure in several spans
    WHEN streamed under flag THEN the spans counted are the ones the whole answer holds:
    a span that straddles a window is judged once, whole."""
    policy, start = world
    key = policy.key(use_case="rag-bot")
    policy.guardrail(key, "groundedness", side="response", action="flag", config=UNSURE)
    w = start()
    body = rag(" ".join(VOCABULARY[::3]), seed=5, max_tokens=400)
    tokens = confidence.choice_tokens(
        w.direct({**body, "logprobs": True})["choices"][0]["logprobs"]
    )
    assert tokens is not None
    expected = confidence.spans(tokens, MIN_LOGPROB, MIN_SPAN)

    response = w.post(key, {**body, "stream": True})

    assert response.status_code == 200
    [entry] = w.findings(1)
    assert orjson.loads(entry["entities"]) == {"low_confidence": len(expected)}


# --- the pieces, without processes ---------------------------------------------------------
@dataclass(frozen=True)
class Selected:
    guardrail: str
    side: str
    action: str
    config: dict[str, object]


def test_only_a_plan_whose_response_checks_read_logprobs_asks_for_them() -> None:
    def plan(*selections: Selected) -> bool:
        return plan_guardrails(selections, "closed").logprobs

    assert plan(Selected("groundedness", "response", "flag", {"method": "logprobs"}))
    assert plan(Selected("groundedness", "response", "block", {"method": "both", "model": "e"}))
    assert not plan(Selected("groundedness", "response", "flag", {"model": "e"}))
    assert not plan(Selected("pii", "both", "redact", {}))
    assert not plan()


@pytest.mark.parametrize(
    ("path", "body", "sent"),
    [
        (CHAT, b'{"model":"m"}', b'{"model":"m","logprobs":true}'),
        # The client's false or null is replaced, never repeated.
        (CHAT, b'{"logprobs":false,"n":2}', b'{"logprobs":true,"n":2}'),
        (COMPLETIONS, b'{"logprobs":null}', b'{"logprobs":0}'),
        (CHAT, b'{"logprobs":true}', b'{"logprobs":true}'),
        (CHAT, b'{"top_logprobs":2}', b'{"top_logprobs":2}'),  # vLLM refuses it as it is
        (COMPLETIONS, b'{"prompt":"p"}', b'{"prompt":"p","logprobs":0}'),
        (COMPLETIONS, b'{"logprobs":3}', b'{"logprobs":3}'),
    ],
)
def test_the_upstream_body_asks_for_logprobs_unless_the_client_did(
    path: str, body: bytes, sent: bytes
) -> None:
    assert ask_logprobs(path, body, orjson.loads(body)) == sent


def test_an_answer_without_logprobs_fails_the_check_rather_than_passing() -> None:
    """GIVEN method logprobs WHEN the answer carries none (an async task's, a replica that
    ignored the request) THEN the check cannot run: the use case's failure mode decides."""
    settings = validate_selection("groundedness", "response", "block", {"method": "logprobs"})
    check = Check("groundedness", "block", settings)
    with pytest.raises(FleetCheckFailed, match="no token logprobs"):
        asyncio.run(run_fleet_check(NoFleet(), check, "response", ["text"], Answered({})))
    found = asyncio.run(
        run_fleet_check(
            NoFleet(), check, "response", ["t"], Answered({}, {0: [(" made", -5.0)] * 3})
        )
    )
    assert found == [Summary("groundedness", "blocked", {"low_confidence": 1}, 0.9933)]


class NoFleet:
    """A ``FleetCaller`` for checks that must not ask the fleet anything."""

    async def post_json(
        self, model: str, path: str, body: dict[str, Any], *, priority_class: str
    ) -> dict[str, Any]:
        raise AssertionError(f"asked {model!r}")
