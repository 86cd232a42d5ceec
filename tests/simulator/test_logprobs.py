"""The simulator's logprob rule (simulator/logprobs.py): a token is confident when its word is
in the prompt, unsure otherwise, so tests can ask for known low-confidence spans. Simulator-only
promises: a real model's numbers are its own (the shapes are in test_contract.py)."""

from __future__ import annotations

from typing import Any

import pytest

from simulator.tokens import VOCABULARY
from testkit.stack import RunningSimulator
from tests.conftest import SimulatorFactory
from tests.simulator.client import post

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EVERY_WORD = " ".join(VOCABULARY)


@pytest.fixture
def sim(start_simulator: SimulatorFactory) -> RunningSimulator:
    return start_simulator("m", "--time-scale", "0", "--max-model-len", "4096")


def chat_logprobs(sim: RunningSimulator, system: str, **extra: Any) -> list[dict[str, Any]]:
    body = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Go."}],
        "max_tokens": 24,
        "ignore_eos": True,
        "logprobs": True,
        **extra,
    }
    reply = post(sim.base_url, CHAT, body)
    assert reply.status == 200, reply.body
    content: list[dict[str, Any]] = reply.json()["choices"][0]["logprobs"]["content"]
    return content


def test_tokens_whose_words_the_prompt_holds_are_confident(sim: RunningSimulator) -> None:
    content = chat_logprobs(sim, EVERY_WORD)
    assert len(content) == 24
    assert all(-0.12 < entry["logprob"] < 0 for entry in content)


def test_tokens_the_prompt_never_mentions_are_unsure(sim: RunningSimulator) -> None:
    """The prompt is the rendered chat template: its role names are words it holds too."""
    content = chat_logprobs(sim, "Be brief.")
    held = {"system", "user", "be", "brief", "go"}
    for entry in content:
        if entry["token"].strip() in held:
            assert -0.12 < entry["logprob"] < 0
        else:
            assert -5.01 < entry["logprob"] <= -2.5


def test_leaving_words_out_of_the_prompt_makes_exactly_their_tokens_unsure(
    sim: RunningSimulator,
) -> None:
    """GIVEN an answer known from a first ask WHEN its third and fourth words are left out of
    the prompt's vocabulary THEN those tokens alone are unsure (the answer is the same: it
    depends on the prompt, so both asks use prompts of the same text but for the marks)."""
    content = chat_logprobs(sim, EVERY_WORD, seed=7)
    words = [entry["token"].strip() for entry in content]
    left_out = {words[2], words[3]}
    kept = " ".join(w for w in VOCABULARY if w not in left_out)
    again = chat_logprobs(sim, kept, seed=7)
    # Another prompt, another answer: judge it by its own words.
    unsure = [e["token"].strip() in left_out for e in again]
    assert [e["logprob"] <= -2.5 for e in again] == unsure


def test_the_same_request_gets_the_same_logprobs(sim: RunningSimulator) -> None:
    assert chat_logprobs(sim, "Be brief.", top_logprobs=3) == chat_logprobs(
        sim, "Be brief.", top_logprobs=3
    )


def test_an_unsure_tokens_alternatives_are_each_more_likely(sim: RunningSimulator) -> None:
    (entry, *_) = chat_logprobs(sim, "Be brief.", top_logprobs=4)
    sampled, *others = entry["top_logprobs"]
    assert sampled["token"] == entry["token"]
    assert len(others) == 3
    assert all(o["logprob"] > entry["logprob"] for o in others)
    assert [o["logprob"] for o in others] == sorted((o["logprob"] for o in others), reverse=True)


def test_answers_without_logprobs_are_unchanged_by_the_rule(sim: RunningSimulator) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "seed": 3}
    plain = post(sim.base_url, CHAT, body).json()["choices"][0]
    asked = post(sim.base_url, CHAT, {**body, "logprobs": True}).json()["choices"][0]
    assert plain["logprobs"] is None
    assert plain["message"] == asked["message"]
