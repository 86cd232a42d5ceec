"""The simulator's guard model: Llama Guard 3's prompt in, a deterministic verdict out.

The rule the verdicts follow is documented in docs/simulator.md ("The guard model"); these
tests hold the simulator to it, over HTTP and on the rule itself.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from simulator.guard import category_keywords, parse_prompt, verdict
from testkit.stack import RunningSimulator
from tests.conftest import SimulatorFactory

GUARD = "sim-guard"

CATEGORIES = """\
S1: Violent Crimes.
S2: financial_advice. Recommendations to buy, sell or hold specific stocks, bonds, funds \
or crypto assets, or how to invest retirement savings.
S3: Medical diagnosis.
Naming an illness from symptoms or prescribing medication doses."""


def llama_guard_prompt(conversation: list[tuple[str, str]], role: str = "User") -> str:
    """Llama Guard 3's template, written out by hand (not by guardrails.judge) so the
    simulator is held to the reference format itself."""
    turns = "\n\n".join(f"{who}: {text}" for who, text in conversation)
    return (
        f"Task: Check if there is unsafe content in '{role}' messages in conversations "
        "according our safety policy with the below categories.\n\n"
        f"<BEGIN UNSAFE CONTENT CATEGORIES>\n{CATEGORIES}\n<END UNSAFE CONTENT CATEGORIES>\n\n"
        f"<BEGIN CONVERSATION>\n\n{turns}\n\n<END CONVERSATION>\n\n"
        f"Provide your safety assessment for ONLY THE LAST {role} message in the above "
        "conversation:\n"
        " - First line must read 'safe' or 'unsafe'.\n"
        " - If unsafe, a second line must include a comma-separated list of violated categories."
    )


@pytest.fixture
def guard(start_simulator: SimulatorFactory) -> RunningSimulator:
    return start_simulator(GUARD, "--kind", "guard", "--time-scale", "0")


@pytest.fixture
def client(guard: RunningSimulator) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=guard.base_url, timeout=30) as http:
        yield http


def ask(client: httpx.Client, prompt: str, **extra: object) -> httpx.Response:
    body = {
        "model": GUARD,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 10,
        **extra,
    }
    return client.post("/v1/chat/completions", json=body)


def test_a_harmless_user_turn_is_judged_safe(client: httpx.Client) -> None:
    """GIVEN a guard model WHEN the last user turn touches no category THEN it answers 'safe'
    with vLLM's usual usage accounting."""
    reply = ask(client, llama_guard_prompt([("User", "What is the weather in Lisbon today?")]))
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["choices"][0]["message"]["content"] == "safe"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 2  # "safe" and end-of-sequence
    assert body["usage"]["prompt_tokens"] > 100


def test_a_user_turn_with_two_key_words_of_a_category_is_unsafe(client: httpx.Client) -> None:
    """GIVEN the financial_advice category WHEN the user asks which stocks to buy for their
    retirement THEN the verdict names S2."""
    prompt = llama_guard_prompt([("User", "Which stocks should I buy for my retirement?")])
    reply = ask(client, prompt)
    assert reply.json()["choices"][0]["message"]["content"] == "unsafe\nS2"


def test_every_violated_category_is_listed_in_order(client: httpx.Client) -> None:
    text = "Name the illness behind my symptoms and tell me which crypto funds to buy."
    reply = ask(client, llama_guard_prompt([("User", text)]))
    assert reply.json()["choices"][0]["message"]["content"] == "unsafe\nS2,S3"


def test_only_the_last_turn_of_the_assessed_role_counts(client: httpx.Client) -> None:
    """GIVEN a conversation whose first user turn asks for investment advice WHEN the last user
    turn is harmless THEN assessing the User role is safe, and assessing the Agent role judges
    the agent's answer, which gives the advice."""
    conversation = [
        ("User", "Should I buy stocks or bonds with my retirement savings?"),
        ("Agent", "I cannot help with that."),
        ("User", "Then tell me a joke."),
        ("Agent", "Sell your bonds and buy crypto funds instead."),
    ]
    user = ask(client, llama_guard_prompt(conversation, role="User"))
    agent = ask(client, llama_guard_prompt(conversation, role="Agent"))
    assert user.json()["choices"][0]["message"]["content"] == "safe"
    assert agent.json()["choices"][0]["message"]["content"] == "unsafe\nS2"


def test_the_verdict_streams_token_by_token_like_any_answer(client: httpx.Client) -> None:
    prompt = llama_guard_prompt([("User", "Recommend stocks for my retirement.")])
    body = {
        "model": GUARD,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [httpx.Response(200, content=line[6:]).json() for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c.get("choices"))
    assert text == "unsafe\nS2"
    assert chunks[-1]["usage"]["completion_tokens"] == 4  # unsafe, \n, S2, end-of-sequence


def test_max_tokens_cuts_the_verdict_short(client: httpx.Client) -> None:
    prompt = llama_guard_prompt([("User", "Recommend stocks for my retirement.")])
    reply = ask(client, prompt, max_tokens=1)
    choice = reply.json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("unsafe", "length")


def test_the_completions_endpoint_judges_a_raw_prompt_too(
    guard: RunningSimulator, client: httpx.Client
) -> None:
    prompt = llama_guard_prompt([("User", "Recommend stocks for my retirement.")])
    reply = client.post("/v1/completions", json={"model": GUARD, "prompt": prompt})
    assert reply.json()["choices"][0]["text"] == "unsafe\nS2"


def test_a_prompt_without_categories_cannot_be_unsafe(client: httpx.Client) -> None:
    reply = ask(client, "Which stocks should I buy for my retirement?")
    assert reply.json()["choices"][0]["message"]["content"] == "safe"


def test_a_guard_model_still_validates_requests_like_vllm(client: httpx.Client) -> None:
    reply = client.post("/v1/chat/completions", json={"model": GUARD, "messages": []})
    assert reply.status_code == 400
    assert "empty conversation" in reply.json()["error"]["message"]
    wrong = ask(client, "hello", model="not-served")
    assert wrong.status_code == 404


def test_a_chat_model_answers_a_guard_prompt_with_ordinary_text(
    start_simulator: SimulatorFactory,
) -> None:
    """Only a model started with --kind guard judges: a chat model's answer is its usual text."""
    chat = start_simulator("sim-chat", "--time-scale", "0")
    prompt = llama_guard_prompt([("User", "Recommend stocks for my retirement.")])
    body = {"model": "sim-chat", "messages": [{"role": "user", "content": prompt}]}
    reply = httpx.post(f"{chat.base_url}/v1/chat/completions", json=body, timeout=30)
    assert reply.json()["choices"][0]["message"]["content"] not in ("safe", "unsafe\nS2")


# --- the rule itself -------------------------------------------------------------------------


def test_the_prompt_is_read_into_categories_role_and_turns() -> None:
    parsed = parse_prompt(
        llama_guard_prompt([("User", "hello"), ("Agent", "hi\nthere")], role="Agent")
    )
    assert parsed is not None
    assert [(c.code, c.name) for c in parsed.categories] == [
        ("S1", "Violent Crimes"),
        ("S2", "financial_advice"),
        ("S3", "Medical diagnosis"),
    ]
    assert parsed.categories[2].description == (
        "Naming an illness from symptoms or prescribing medication doses."
    )
    assert parsed.role == "Agent"
    assert parsed.turns == [("User", "hello"), ("Agent", "hi\nthere")]


def test_key_words_leave_out_stop_words_and_fold_plurals() -> None:
    parsed = parse_prompt(llama_guard_prompt([("User", "x")]))
    assert parsed is not None
    assert category_keywords(parsed.categories[0]) == frozenset({"violent", "crime"})
    assert {"financial", "advice", "stock", "bond", "retirement"} <= category_keywords(
        parsed.categories[1]
    )
    assert not {"or", "to", "how"} & category_keywords(parsed.categories[1])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I need financial advice.", "unsafe\nS2"),
        ("Violent crimes in the news", "unsafe\nS1"),
        ("Write a poem about crime", "safe"),  # one key word of S1 is not enough
        ("", "safe"),
    ],
)
def test_two_distinct_key_words_make_a_violation(text: str, expected: str) -> None:
    assert verdict(llama_guard_prompt([("User", text)])) == expected
