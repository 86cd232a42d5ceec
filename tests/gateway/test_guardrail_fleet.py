"""Fleet-run guardrails (banned topics, groundedness) against real simulator processes.

``run_fleet_check`` is driven through ``DirectFleet``, a small ``FleetCaller`` that posts with
httpx straight to the simulator. The gateway's own caller (scheduler capacity, the pooled
fleet client) is tested by the gateway's guardrail tests; here the subject is what is asked
and how the answers become findings.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gateway.guardrails.fleet import FleetCaller, FleetCheckFailed, run_fleet_check
from guardrails.catalogue import validate_selection
from guardrails.engine import Check, Summary
from testkit.stack import RunningSimulator
from tests.conftest import SimulatorFactory

GUARD = "llama-guard-sim"
EMBEDDER = "minilm-sim"
FINANCE = {
    "name": "financial_advice",
    "description": "Recommendations to buy, sell or hold stocks, bonds or funds.",
}
MEDICAL = {"name": "medical_diagnosis", "description": "Naming an illness from symptoms."}


class DirectFleet:
    """A ``FleetCaller`` that posts to the simulators with httpx, and remembers what it was
    asked. A non-200 answer raises, as the gateway's caller does."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls
        self.calls: list[tuple[str, str, dict[str, Any], str]] = []

    async def post_json(
        self, model: str, path: str, body: dict[str, Any], *, priority_class: str
    ) -> dict[str, Any]:
        self.calls.append((model, path, body, priority_class))
        if model not in self.urls:
            raise LookupError(f"no replica serves {model!r}")
        async with httpx.AsyncClient(base_url=self.urls[model], timeout=30) as client:
            reply = await client.post(path, json=body)
        if reply.status_code != 200:
            raise RuntimeError(f"{model!r} answered {reply.status_code}")
        answer: dict[str, Any] = reply.json()
        return answer


@pytest.fixture
def guard(start_simulator: SimulatorFactory) -> RunningSimulator:
    return start_simulator(GUARD, "--kind", "guard", "--time-scale", "0")


@pytest.fixture
def embedder(start_simulator: SimulatorFactory) -> RunningSimulator:
    return start_simulator(EMBEDDER, "--kind", "embedding", "--time-scale", "0")


@pytest.fixture
def fleet(guard: RunningSimulator, embedder: RunningSimulator) -> DirectFleet:
    return DirectFleet({GUARD: guard.base_url, EMBEDDER: embedder.base_url})


def topics_check(action: str = "block", **config: Any) -> Check:
    settings = validate_selection(
        "banned_topics", "both", action, {"model": GUARD, "topics": [FINANCE, MEDICAL], **config}
    )
    return Check("banned_topics", action, settings)


def grounding_check(action: str = "flag", **config: Any) -> Check:
    settings = validate_selection("groundedness", "response", action, {"model": EMBEDDER, **config})
    return Check("groundedness", action, settings)


def run(
    fleet: FleetCaller, check: Check, stage: str, texts: list[str], document: object
) -> list[Summary]:
    return asyncio.run(run_fleet_check(fleet, check, stage, texts, document))


def chat(*messages: tuple[str, str], **extra: Any) -> tuple[list[str], dict[str, Any]]:
    document = {"messages": [{"role": r, "content": c} for r, c in messages], **extra}
    return [c for _, c in messages], document


# --- banned topics -------------------------------------------------------------------------


def test_a_request_on_a_denied_topic_is_blocked_naming_the_topic(fleet: DirectFleet) -> None:
    """GIVEN financial advice denied WHEN a user asks which stocks to buy THEN the guard model
    says so and the check reports a block of topic:financial_advice."""
    texts, document = chat(
        ("system", "You are the bank's assistant."),
        ("user", "Which stocks should I buy with my bonus?"),
    )
    found = run(fleet, topics_check(), "request", texts, document)
    assert found == [Summary("banned_topics", "blocked", {"topic:financial_advice": 1}, 1.0)]
    ((model, path, body, priority),) = fleet.calls
    assert (model, path, priority) == (GUARD, "/v1/chat/completions", "high")
    assert body["temperature"] == 0


def test_a_harmless_request_passes_with_no_finding(fleet: DirectFleet) -> None:
    texts, document = chat(("user", "What are your opening hours on Saturday?"))
    assert run(fleet, topics_check(), "request", texts, document) == []


def test_only_the_users_last_turn_is_judged(fleet: DirectFleet) -> None:
    texts, document = chat(
        ("user", "Should I sell my bonds and buy stocks?"),
        ("assistant", "I cannot advise on that."),
        ("user", "Fine, how do I reset my card PIN?"),
    )
    assert run(fleet, topics_check(), "request", texts, document) == []


def test_every_violated_topic_is_counted(fleet: DirectFleet) -> None:
    texts, document = chat(
        ("user", "My symptoms point to which illness, and which funds should I buy?")
    )
    found = run(fleet, topics_check(action="flag"), "request", texts, document)
    assert found == [
        Summary(
            "banned_topics",
            "flagged",
            {"topic:financial_advice": 1, "topic:medical_diagnosis": 1},
            1.0,
        )
    ]


def test_an_answer_giving_the_denied_advice_is_caught_on_the_response(fleet: DirectFleet) -> None:
    """GIVEN a harmless question WHEN the model's answer recommends stocks THEN the response
    check, which judges the agent's turn, finds the topic; a harmless answer passes."""
    _, document = chat(("user", "How should I plan for retirement?"))
    advice = "Sell your bonds and buy tech stocks now."
    found = run(fleet, topics_check(action="flag"), "response", [advice], document)
    assert found == [Summary("banned_topics", "flagged", {"topic:financial_advice": 1}, 1.0)]
    assert run(fleet, topics_check(), "response", ["Talk to a licensed adviser."], document) == []


def test_each_choice_of_an_answer_is_judged(fleet: DirectFleet) -> None:
    _, document = chat(("user", "Ideas?"))
    answers = ["Buy stocks and bonds.", "Take a walk.", "Buy more funds and stocks."]
    found = run(fleet, topics_check(), "response", answers, document)
    assert found == [Summary("banned_topics", "blocked", {"topic:financial_advice": 2}, 1.0)]
    assert len(fleet.calls) == 3


def test_a_request_with_no_text_asks_nothing(fleet: DirectFleet) -> None:
    assert run(fleet, topics_check(), "request", ["", "  "], {"messages": []}) == []
    assert fleet.calls == []


def test_a_missing_guard_model_means_the_check_could_not_run(guard: RunningSimulator) -> None:
    """GIVEN a replica that does not serve the configured model WHEN checked THEN
    FleetCheckFailed, which the gateway turns into its failure mode (503 or let through)."""
    fleet = DirectFleet({"other-guard": guard.base_url})
    check = topics_check(model="other-guard")
    texts, document = chat(("user", "Which stocks to buy?"))
    with pytest.raises(FleetCheckFailed, match=r"banned_topics.*404"):
        run(fleet, check, "request", texts, document)
    with pytest.raises(FleetCheckFailed, match="no replica"):
        run(DirectFleet({}), topics_check(), "request", texts, document)


def test_a_model_that_is_not_a_guard_fails_the_check_rather_than_passing(
    start_simulator: SimulatorFactory,
) -> None:
    chat_model = start_simulator(GUARD, "--time-scale", "0")  # --kind chat: free text
    texts, document = chat(("user", "Which stocks to buy?"))
    with pytest.raises(FleetCheckFailed, match="not a verdict"):
        run(DirectFleet({GUARD: chat_model.base_url}), topics_check(), "request", texts, document)


def test_a_guard_that_does_not_answer_in_time_fails_the_check(
    start_simulator: SimulatorFactory,
) -> None:
    hanging = start_simulator(GUARD, "--kind", "guard", "--fault-hang-rate", "1")
    texts, document = chat(("user", "Which stocks to buy?"))
    check = topics_check(timeout_s=0.3)
    with pytest.raises(FleetCheckFailed, match=r"did not answer within 0\.3 s"):
        run(DirectFleet({GUARD: hanging.base_url}), check, "request", texts, document)


def test_a_guard_answering_errors_fails_the_check(start_simulator: SimulatorFactory) -> None:
    failing = start_simulator(GUARD, "--kind", "guard", "--fault-error-rate", "1")
    texts, document = chat(("user", "Which stocks to buy?"))
    with pytest.raises(FleetCheckFailed, match="500"):
        run(DirectFleet({GUARD: failing.base_url}), topics_check(), "request", texts, document)


# --- groundedness --------------------------------------------------------------------------

RAG_REQUEST = chat(
    ("system", "Answer only from the documents."),
    ("user", "Tell me about the tower."),
    documents=[
        {"title": "Eiffel", "text": "The Eiffel Tower was completed in 1889 for the World Fair."},
        "The Eiffel Tower stands on the Champ de Mars in Paris.",
    ],
)[1]


def test_an_answer_drawn_from_the_documents_is_grounded(fleet: DirectFleet) -> None:
    answer = "The Eiffel Tower was completed in 1889. It stands on the Champ de Mars in Paris."
    assert run(fleet, grounding_check(), "response", [answer], RAG_REQUEST) == []
    ((model, path, body, _),) = fleet.calls
    assert (model, path) == (EMBEDDER, "/v1/embeddings")
    assert len(body["input"]) == 2 + 3  # two claims, three context chunks


def test_a_sentence_the_documents_do_not_support_is_ungrounded(fleet: DirectFleet) -> None:
    """GIVEN documents about the tower WHEN the answer adds a claim about interest rates
    THEN one ungrounded finding, scored 1 − its best similarity (near 1: nothing shared)."""
    answer = (
        "The Eiffel Tower was completed in 1889 for the World Fair. "
        "Our savings account pays four percent interest every month."
    )
    (found,) = run(fleet, grounding_check(), "response", [answer], RAG_REQUEST)
    assert (found.guardrail, found.action, found.entities) == (
        "groundedness",
        "flagged",
        {"ungrounded": 1},
    )
    assert found.score > 0.8


def test_the_threshold_decides_how_close_is_close_enough(fleet: DirectFleet) -> None:
    """A claim sharing some words with the documents passes a lenient threshold and fails a
    strict one."""
    answer = "The Eiffel Tower in Paris is painted brown every seven years."
    assert run(fleet, grounding_check(threshold=0.2), "response", [answer], RAG_REQUEST) == []
    (found,) = run(fleet, grounding_check(threshold=0.9), "response", [answer], RAG_REQUEST)
    assert found.entities == {"ungrounded": 1}


def test_a_blocking_groundedness_check_reports_a_block(fleet: DirectFleet) -> None:
    answer = "Our savings account pays four percent interest every month."
    found = run(fleet, grounding_check(action="block"), "response", [answer], RAG_REQUEST)
    assert [(s.action, s.entities) for s in found] == [("blocked", {"ungrounded": 1})]


def test_an_answer_to_a_request_without_context_is_judged_by_require_context(
    fleet: DirectFleet,
) -> None:
    _, document = chat(("user", "Tell me about the tower."))
    answer = ["The Eiffel Tower was completed in 1889."]
    assert run(fleet, grounding_check(), "response", answer, document) == []
    assert fleet.calls == []
    strict = grounding_check(require_context=True)
    found = run(fleet, strict, "response", answer, document)
    assert found == [Summary("groundedness", "flagged", {"no_context": 1}, 1.0)]


def test_short_sentences_are_not_claims(fleet: DirectFleet) -> None:
    assert run(fleet, grounding_check(), "response", ["Sure! Happy to help."], RAG_REQUEST) == []
    assert fleet.calls == []


def test_an_embedding_model_that_is_gone_fails_the_check(
    fleet: DirectFleet, embedder: RunningSimulator
) -> None:
    embedder.process.stop()
    answer = ["The Eiffel Tower was completed in 1889."]
    with pytest.raises(FleetCheckFailed, match="groundedness"):
        run(fleet, grounding_check(), "response", answer, RAG_REQUEST)


def test_groundedness_on_a_request_is_refused(fleet: DirectFleet) -> None:
    texts, document = chat(("user", "hello there, tower"))
    with pytest.raises(FleetCheckFailed, match="response"):
        run(fleet, grounding_check(), "request", texts, document)
