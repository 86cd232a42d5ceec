"""An answer's tool-call arguments are texts like its content: an agent's answer that puts a
credential or a name into a function's arguments is checked, and redacted in place."""

from __future__ import annotations

import orjson

from guardrails.engine import Check
from guardrails.texts import answer_slots

GITHUB = "ghp_4kT9mQ2xR7vL1pZ8sW3yN6bC0dF5hJ2gK9aE"


def _answer() -> dict:
    arguments = orjson.dumps({"repo": "ledger", "token": GITHUB}).decode()
    return {
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "Pushing the fix now.",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "git_push", "arguments": arguments},
                        }
                    ],
                },
            }
        ],
    }


def test_an_answers_tool_call_arguments_are_read_as_the_assistants_text():
    answer = _answer()
    slots = answer_slots("/v1/chat/completions", answer)
    assert [(key, role) for _, key, role in slots] == [
        ("content", "assistant"),
        ("arguments", "assistant"),
    ]


def test_a_secret_in_tool_call_arguments_is_redacted_where_it_is(engine):
    """GIVEN an answer whose tool call carries a token in its arguments WHEN the response
    stage's secrets check redacts THEN the arguments are rewritten in place, the content is
    untouched, and the finding is recorded by entity name only."""
    answer = _answer()
    slots = answer_slots("/v1/chat/completions", answer)
    outcome = engine.run(
        [container[key] for container, key, _ in slots], [Check("secrets", "redact")]
    )
    for (container, key, _), text in zip(slots, outcome.texts, strict=True):
        container[key] = text
    message = answer["choices"][0]["message"]
    assert message["content"] == "Pushing the fix now."
    arguments = orjson.loads(message["tool_calls"][0]["function"]["arguments"])
    assert arguments == {"repo": "ledger", "token": "<GITHUB_TOKEN>"}
    assert GITHUB not in orjson.dumps(answer).decode()
    assert [s.entities for s in outcome.findings] == [{"GITHUB_TOKEN": 1}]
