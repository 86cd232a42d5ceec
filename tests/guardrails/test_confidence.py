"""Low-confidence spans (guardrails/confidence.py): reading vLLM's two logprob shapes, and
which runs of tokens count as a span. The token lists are written by hand here;
tests/gateway/test_groundedness_logprobs.py gets them from the simulator through the gateway."""

from __future__ import annotations

import math

import pytest

from guardrails.base import Finding
from guardrails.confidence import (
    Span,
    answer_tokens,
    choice_tokens,
    client_asked,
    open_run,
    spans,
    strip,
)

SURE, UNSURE = -0.05, -3.0


def test_a_run_of_enough_unsure_tokens_is_a_span_scored_by_its_mean_probability() -> None:
    """GIVEN tokens sure, unsure × 3, sure, unsure × 2 WHEN a span needs 3 tokens below -2
    THEN one span: the three, their text joined, scored 1 − e^(mean logprob)."""
    tokens = [
        ("The", SURE),
        (" tower", -2.5),
        (" was", -3.5),
        (" green", -3.0),
        (".", SURE),
        (" It", UNSURE),
        (" is", UNSURE),
    ]
    assert spans(tokens, -2.0, 3) == [Span(1, 4, "tower was green", round(1 - math.exp(-3.0), 4))]
    assert [s.text for s in spans(tokens, -2.0, 2)] == ["tower was green", "It is"]
    assert spans(tokens, -4.0, 1) == []


def test_a_span_is_reported_as_a_low_confidence_finding_without_its_text() -> None:
    assert Span(0, 2, "made up", 0.95).finding() == Finding("low_confidence", score=0.95)


def test_tokens_without_text_neither_count_nor_break_a_run() -> None:
    tokens = [(" a", UNSURE), ("", SURE), (" b", UNSURE), ("", UNSURE)]
    [span] = spans(tokens, -2.0, 2)
    assert span.text == "a b"
    assert spans([("", UNSURE)] * 4, -2.0, 1) == []


def test_the_open_run_is_where_the_unsure_tokens_a_sequence_ends_on_begin() -> None:
    assert open_run([("a", SURE), ("b", UNSURE), ("", SURE), ("c", UNSURE)], -2.0) == 1
    assert open_run([("a", UNSURE), ("b", SURE)], -2.0) == 2
    assert open_run([], -2.0) == 0


def test_chat_and_completion_logprobs_are_read_alike() -> None:
    chat = {
        "content": [
            {"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []},
            {"token": "!", "logprob": -9999.0, "bytes": [33], "top_logprobs": []},
        ]
    }
    completion = {
        "text_offset": [0, 2, 3],
        "token_logprobs": [None, -0.5, -9999],
        "tokens": ["Go", "Hi", "!"],
        "top_logprobs": [None, {"Hi": -0.5}, {"!": -9999}],
    }
    assert choice_tokens(chat) == [("Hi", -0.5), ("!", -9999.0)]
    # A null logprob is an echoed prompt token: not generated, not judged.
    assert choice_tokens(completion) == [("Hi", -0.5), ("!", -9999.0)]


@pytest.mark.parametrize(
    "logprobs",
    [
        None,
        {"content": None},
        {"content": [{"token": "a", "logprob": "low"}]},
        {"content": [{"token": "a", "logprob": float("nan")}]},
        {"content": [{"token": 3, "logprob": -1.0}]},
        {"tokens": ["a"], "token_logprobs": []},
        {"tokens": ["a"], "token_logprobs": [True]},
    ],
)
def test_logprobs_that_are_not_tokens_and_numbers_read_as_none(logprobs: object) -> None:
    assert choice_tokens(logprobs) is None


def test_an_answer_gives_each_choices_tokens_or_none_when_one_lacks_them() -> None:
    entry = {"content": [{"token": "a", "logprob": -1.0}]}
    answer = {"choices": [{"index": 1, "logprobs": entry}, {"index": 0, "logprobs": entry}]}
    assert answer_tokens(answer) == {1: [("a", -1.0)], 0: [("a", -1.0)]}
    answer["choices"][0]["logprobs"] = None
    assert answer_tokens(answer) is None
    assert answer_tokens({"error": {}}) is None


def test_strip_leaves_each_choice_as_vllm_sends_it_unasked() -> None:
    answer = {"choices": [{"index": 0, "logprobs": {"content": []}, "text": "x"}]}
    strip(answer)
    assert answer == {"choices": [{"index": 0, "logprobs": None, "text": "x"}]}


@pytest.mark.parametrize(
    ("path", "document", "asked"),
    [
        ("/v1/chat/completions", {"logprobs": True}, True),
        ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 0}, False),
        ("/v1/chat/completions", {}, False),
        ("/v1/completions", {"logprobs": 0}, True),
        ("/v1/completions", {"logprobs": None}, False),
        ("/v1/completions", None, False),
    ],
)
def test_what_counts_as_the_client_asking(path: str, document: object, asked: bool) -> None:
    assert client_asked(path, document) is asked
