"""Groundedness: its settings, where it finds the context, how it splits claims, how it scores.

The vectors here are written by hand; tests/gateway/test_guardrail_fleet.py gets them from the
simulator's embedding model.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from guardrails.base import Finding, SettingsError
from guardrails.catalogue import validate_selection
from guardrails.grounding import GroundednessCheck, needs_logprobs

check = GroundednessCheck()


def settings(**overrides: Any) -> dict[str, Any]:
    return check.validate({"model": "embedder", **overrides})


def test_settings_are_completed_with_defaults() -> None:
    done = settings()
    assert done["model"] == "embedder"
    assert done["threshold"] == 0.5
    assert done["context_roles"] == ["system", "tool"]
    assert done["documents_field"] == "documents"
    assert done["min_claim_chars"] == 20
    assert done["require_context"] is False
    assert done["method"] == "embedding"
    assert done["min_logprob"] == -2.3
    assert done["min_span_tokens"] == 3


def test_the_logprobs_method_needs_no_embedding_model() -> None:
    """GIVEN method logprobs THEN no model is asked for (the answer brings its evidence);
    method both still needs the embedding model."""
    done = check.validate({"method": "logprobs", "min_logprob": -1.5, "min_span_tokens": 2})
    assert (done["method"], done["model"]) == ("logprobs", None)
    assert (done["min_logprob"], done["min_span_tokens"]) == (-1.5, 2)
    assert check.validate({"method": "both", "model": "e"})["model"] == "e"
    with pytest.raises(SettingsError, match="'model' is required"):
        check.validate({"method": "both"})


def test_the_plan_asks_for_logprobs_only_for_the_methods_that_read_them() -> None:
    assert needs_logprobs({"method": "logprobs"})
    assert needs_logprobs({"method": "both", "model": "e"})
    assert not needs_logprobs({"model": "e"})
    assert not needs_logprobs({"method": "embedding", "model": "e"})


def test_the_catalogue_allows_groundedness_on_responses_only() -> None:
    assert validate_selection("groundedness", "response", "flag", {"model": "e"})["model"] == "e"
    with pytest.raises(SettingsError, match="response only"):
        validate_selection("groundedness", "request", "flag", {"model": "e"})


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({}, "'model' is required"),
        ({"model": "e", "threshold": 0}, "'threshold'"),
        ({"model": "e", "threshold": 1.5}, "'threshold'"),
        ({"model": "e", "threshold": "high"}, "'threshold'"),
        ({"model": "e", "context_roles": "system"}, "'context_roles' must be a list"),
        ({"model": "e", "context_roles": ["narrator"]}, "'narrator' is not a message role"),
        ({"model": "e", "documents_field": ""}, "'documents_field'"),
        ({"model": "e", "documents_field": "messages"}, "'documents_field'"),
        ({"model": "e", "context_roles": [], "documents_field": None}, "no context"),
        ({"model": "e", "min_claim_chars": -1}, "'min_claim_chars'"),
        ({"model": "e", "max_claims": 0}, "'max_claims'"),
        ({"model": "e", "chunk_chars": 10}, "'chunk_chars'"),
        ({"model": "e", "require_context": "yes"}, "'require_context'"),
        ({"model": "e", "top_k": 3}, "Unknown setting 'top_k'"),
        ({"model": "e", "method": "vibes"}, "'method' must be one of"),
        ({"method": "logprobs", "min_logprob": 0}, "'min_logprob' must be below 0"),
        ({"method": "logprobs", "min_logprob": 0.5}, "'min_logprob'"),
        ({"method": "logprobs", "min_logprob": "low"}, "'min_logprob'"),
        ({"method": "logprobs", "min_span_tokens": 0}, "'min_span_tokens'"),
        ({"method": "logprobs", "min_span_tokens": 1.5}, "'min_span_tokens'"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(given: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        check.validate(given)


def test_check_says_it_runs_in_the_gateway() -> None:
    with pytest.raises(NotImplementedError, match="gateway"):
        check.check("text", settings())


def test_the_context_is_system_and_tool_messages_and_the_documents_field() -> None:
    """GIVEN a RAG request WHEN its context is read THEN system and tool messages and each
    supplied document count, the user's question does not, and long texts are chunked on
    sentence boundaries."""
    document = {
        "messages": [
            {"role": "system", "content": "Answer from the documents. Be brief."},
            {"role": "user", "content": "When was the tower finished?"},
            {"role": "tool", "content": [{"type": "text", "text": "Tower height: 330 m."}]},
        ],
        "documents": [
            {"title": "Eiffel", "text": "The tower was finished in 1889."},
            "It stands in Paris.",
            {"title": "no text"},
            7,
        ],
    }
    assert check.context(document, settings()) == [
        "Answer from the documents. Be brief.",
        "Tower height: 330 m.",
        "The tower was finished in 1889.",
        "It stands in Paris.",
    ]
    chunked = check.context(document, settings(chunk_chars=20))
    assert chunked[:2] == ["Answer from the documents.", "Be brief."]
    assert check.context({"messages": "nonsense"}, settings()) == []
    assert check.context(None, settings()) == []


def test_the_context_roles_and_field_are_the_officers_choice() -> None:
    document = {
        "messages": [{"role": "user", "content": "Here is the contract: rent is 900 a month."}],
        "sources": ["Deposit is two months of rent."],
        "documents": ["ignored"],
    }
    done = settings(context_roles=["user"], documents_field="sources")
    assert check.context(document, done) == [
        "Here is the contract: rent is 900 a month.",
        "Deposit is two months of rent.",
    ]


def test_an_answer_is_split_into_sentence_claims() -> None:
    answer = (
        "The tower was finished in 1889. It is 330 m tall!\n"
        "- It stands in Paris, France.\n"
        "Sure.   Is it open on Sundays? Yes."
    )
    assert check.claims(answer) == [
        "The tower was finished in 1889.",
        "It is 330 m tall!",
        "It stands in Paris, France.",
        "Sure.",
        "Is it open on Sundays?",
        "Yes.",
    ]
    assert check.claims(answer, min_chars=20) == [
        "The tower was finished in 1889.",
        "It stands in Paris, France.",
        "Is it open on Sundays?",
    ]
    assert check.claims("  \n ") == []


def test_a_claim_is_ungrounded_when_no_chunk_is_similar_enough() -> None:
    """GIVEN claims at cosine 1, 0.8 and 0 to their nearest chunk WHEN the threshold is 0.5
    THEN only the last is ungrounded, scored 1 − similarity."""
    lean = [math.sqrt(0.36), math.sqrt(0.64), 0.0]
    claims = [[1.0, 0.0, 0.0], lean, [0.0, 0.0, 2.0]]
    context = [[3.0, 0.0, 0.0], [0.0, 1.0, 0.0]]  # not unit: the check normalises
    found = check.findings(claims, context, settings())
    assert found == [Finding("ungrounded", score=1.0)]
    stricter = check.findings(claims, context, settings(threshold=0.9))
    assert [f.entity for f in stricter] == ["ungrounded", "ungrounded"]
    assert stricter[0].score == pytest.approx(1 - 0.8)


def test_without_context_every_claim_is_ungrounded() -> None:
    assert check.findings([[1.0, 0.0]], [], settings()) == [Finding("ungrounded", score=1.0)]
    assert check.findings([], [[1.0, 0.0]], settings()) == []
