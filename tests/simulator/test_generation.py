"""What the simulated model says: deterministic answers, stops, choices, kinds and limits.

These are simulator-only promises (a real model's words are its own), so they live apart
from the contract tests.
"""

from __future__ import annotations

from typing import Any

import pytest

from testkit.stack import RunningSimulator
from tests.conftest import SimulatorFactory
from tests.simulator.client import post

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.fixture
def sim(start_simulator: SimulatorFactory) -> RunningSimulator:
    return start_simulator("m", "--time-scale", "0", "--max-model-len", "4096")


def chat(sim: RunningSimulator, content: str = "Tell me a story.", **extra: Any) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": content}], **extra}
    reply = post(sim.base_url, CHAT, body)
    assert reply.status == 200, reply.body
    result: dict[str, Any] = reply.json()
    return result


def text(answer: dict[str, Any], index: int = 0) -> str:
    value: str = answer["choices"][index]["message"]["content"]
    return value


def test_the_same_request_gets_the_same_answer(sim: RunningSimulator) -> None:
    first, second = chat(sim, max_tokens=12), chat(sim, max_tokens=12)
    assert text(first) == text(second)
    assert len(text(first).split()) == 12
    assert first["id"] != second["id"]


def test_different_prompts_and_seeds_get_different_answers(sim: RunningSimulator) -> None:
    base = text(chat(sim, max_tokens=12))
    assert text(chat(sim, "Something else entirely.", max_tokens=12)) != base
    assert text(chat(sim, max_tokens=12, seed=1)) != base


def test_a_streamed_answer_is_the_unstreamed_answer(sim: RunningSimulator) -> None:
    whole = text(chat(sim, max_tokens=10))
    chunks = post(
        sim.base_url, CHAT, {"messages": [{"role": "user", "content": "Tell me a story."}],
                             "max_tokens": 10, "stream": True},
    ).chunks()  # fmt: skip
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole


def test_without_max_tokens_the_model_stops_on_its_own(sim: RunningSimulator) -> None:
    answer = chat(sim)
    choice = answer["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", None)
    # The end-of-sequence token counts as generated but has no text.
    assert answer["usage"]["completion_tokens"] == len(text(answer).split()) + 1


def test_an_eos_stop_streams_an_empty_final_delta(sim: RunningSimulator) -> None:
    body = {"messages": [{"role": "user", "content": "Tell me a story."}], "stream": True}
    chunks = post(sim.base_url, CHAT, body).chunks()
    final = chunks[-1]["choices"][0]
    assert (final["delta"], final["finish_reason"]) == ({"content": ""}, "stop")


def test_a_stop_string_ends_the_answer_before_it(sim: RunningSimulator) -> None:
    words = text(chat(sim, max_tokens=8)).split()
    stop = " " + words[4]
    answer = chat(sim, max_tokens=8, stop=[stop])
    choice = answer["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop)
    assert text(answer) == " ".join(words[: words.index(words[4])])

    kept = chat(sim, max_tokens=8, stop=[stop], include_stop_str_in_output=True)
    assert text(kept).endswith(stop)


def test_ignore_eos_runs_to_max_tokens(sim: RunningSimulator) -> None:
    answer = chat(sim, max_tokens=400, ignore_eos=True)
    assert answer["usage"]["completion_tokens"] == 400
    assert answer["choices"][0]["finish_reason"] == "length"


def test_n_choices_differ_and_the_first_matches_n_1(sim: RunningSimulator) -> None:
    single = text(chat(sim, max_tokens=6))
    answer = chat(sim, max_tokens=6, n=3)
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    assert text(answer, 0) == single
    assert len({text(answer, i) for i in range(3)}) == 3
    assert answer["usage"]["completion_tokens"] == 18


def test_several_completion_prompts_get_a_choice_each(sim: RunningSimulator) -> None:
    reply = post(sim.base_url, COMPLETIONS, {"prompt": ["one", "two"], "max_tokens": 3, "n": 2})
    body = reply.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["usage"]["completion_tokens"] == 12


def test_echo_prepends_the_prompt(sim: RunningSimulator) -> None:
    reply = post(sim.base_url, COMPLETIONS, {"prompt": "Once upon", "max_tokens": 3, "echo": True})
    assert reply.json()["choices"][0]["text"].startswith("Once upon")


def test_the_request_id_can_come_from_the_body(sim: RunningSimulator) -> None:
    assert chat(sim, max_tokens=1, request_id="job-7")["id"] == "chatcmpl-job-7"


@pytest.mark.parametrize("kind", ["embedding", "transcription"])
def test_other_kinds_do_not_serve_generation(start_simulator: SimulatorFactory, kind: str) -> None:
    other = start_simulator("m", "--kind", kind)
    for path in (CHAT, COMPLETIONS):
        reply = post(other.base_url, path, {"prompt": "x", "messages": []})
        assert (reply.status, reply.body) == (404, b'{"detail":"Not Found"}')
