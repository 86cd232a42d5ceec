"""Issue 24, defect 2: every text the model will read is checked by the request guardrails,
whatever shape the OpenAI API lets it take; what the gateway cannot read as text while a
request guardrail is selected is refused with a 400 that says so. Answers' tool-call
arguments are text for the response guardrails too.

Against real processes: a gateway, its fleet watcher, the vLLM simulator, Valkey and the
guardrail service (the ``words`` test detector), started once for the module
(testkit/module_stack.py). "guarded" blocks the word "secret" on requests,
"redacting" redacts it, "plain" has no guardrail.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from gateway.errors import GatewayError
from gateway.guardrail_plan import GuardPlan, StageChecks
from gateway.guardrails.stream import GuardedStream
from gateway.response_stage import check_answer
from guardrails.protocol import CheckSpec
from testkit.guardrails import Subject, service_guardrails
from testkit.module_stack import module_stack
from testkit.policy import PolicyBuilder

MODEL = "llama-shapes"
EMBED = "embed-shapes"
SECRET: dict[str, object] = {"words": ["secret"]}
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"


@dataclass
class Shapes:
    base_url: str
    guardrail_url: str
    guarded: str
    redacting: str
    plain: str

    def post(self, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
        model = EMBED if path.endswith("embeddings") else MODEL
        return httpx.post(
            self.base_url + path,
            json={"model": model, **body},
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
        )


@pytest.fixture(scope="module")
def shapes() -> Iterator[Shapes]:
    with module_stack(guardrail_service=True) as stack:
        chat = stack.simulator(MODEL, "--time-scale", "0")
        embed = stack.simulator(EMBED, "--kind", "embedding", "--time-scale", "0")
        policy = PolicyBuilder()
        policy.model(MODEL, [chat], capabilities=("chat", "completions"))
        policy.model(EMBED, [embed], capabilities=("embeddings",))
        guarded = policy.key(use_case="guarded")
        policy.guardrail(guarded, "words", side="request", action="block", config=SECRET)
        redacting = policy.key(use_case="redacting")
        policy.guardrail(redacting, "words", side="request", action="redact", config=SECRET)
        plain = policy.key(use_case="plain")
        yield Shapes(stack.gateway(policy), stack.guardrail_url, guarded, redacting, plain)


def _tool_call(arguments: object) -> dict[str, Any]:
    return {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": arguments},
    }


# Each body carries the word "secret" where the model reads it; with "secret" replaced by a
# harmless word the same body is a valid request.
TEXT_SHAPES = [
    pytest.param(CHAT, {"messages": [{"role": "user", "content": "the secret"}]}, id="chat-string"),
    pytest.param(
        CHAT,
        {"messages": [{"role": "user", "content": ["tell me", "the secret"]}]},
        id="chat-list-of-bare-strings",
    ),
    pytest.param(
        CHAT,
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "no secret"}]},
                {"role": "user", "content": "why?"},
            ]
        },
        id="chat-refusal-part",
    ),
    pytest.param(
        CHAT,
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "refusal": "no secret", "content": None},
                {"role": "user", "content": "why?"},
            ]
        },
        id="chat-assistant-refusal",
    ),
    pytest.param(
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "input_text", "text": "a secret"}]}]},
        id="chat-input-text-part",
    ),
    pytest.param(
        CHAT,
        {
            "messages": [
                {"role": "user", "content": "look it up"},
                {"role": "assistant", "content": None, "tool_calls": [_tool_call("{}")]},
                {"role": "tool", "tool_call_id": "call_1", "content": "the secret is 42"},
            ]
        },
        id="chat-tool-message",
    ),
    pytest.param(
        CHAT,
        {
            "messages": [
                {"role": "user", "content": "look it up"},
                {"role": "assistant", "content": None, "tool_calls": [_tool_call("{}")]},
                {
                    "role": "tool",
                    "tool_call_id": "call_1",
                    "content": [{"type": "text", "text": "the secret is 42"}],
                },
            ]
        },
        id="chat-tool-message-parts",
    ),
    pytest.param(
        CHAT,
        {
            "messages": [
                {"role": "user", "content": "look it up"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [_tool_call('{"query": "the secret"}')],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            ]
        },
        id="chat-assistant-tool-call-arguments",
    ),
    pytest.param(
        CHAT,
        {
            "messages": [{"role": "user", "content": "what is the weather?"}],
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "lookup", "description": "tells the secret plan"},
                }
            ],
        },
        id="chat-tool-description",
    ),
    pytest.param(
        CHAT,
        {
            "messages": [{"role": "user", "content": "what is the weather?"}],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "lookup",
                        "parameters": {
                            "type": "object",
                            "properties": {
                                "q": {"type": "string", "description": "the secret to find"}
                            },
                        },
                    },
                }
            ],
        },
        id="chat-tool-parameter-description",
    ),
    pytest.param(
        CHAT,
        {
            "messages": [{"role": "user", "content": "what is the weather?"}],
            "functions": [{"name": "lookup", "description": "tells the secret plan"}],
        },
        id="chat-legacy-function-description",
    ),
    pytest.param(
        CHAT,
        {
            "messages": [{"role": "user", "content": "what does the wiki say?"}],
            "documents": [{"title": "wiki", "text": "the secret is 42"}],
        },
        id="chat-retrieved-document",
    ),
    pytest.param(
        CHAT,
        {
            "messages": [{"role": "user", "content": "what does the wiki say?"}],
            "documents": [{"title": "the secret page", "text": "42"}],
        },
        id="chat-retrieved-document-title",
    ),
    pytest.param(COMPLETIONS, {"prompt": "the secret"}, id="completion-string"),
    pytest.param(COMPLETIONS, {"prompt": ["fine", "the secret"]}, id="completion-list"),
    pytest.param(EMBEDDINGS, {"input": "the secret"}, id="embedding-string"),
    pytest.param(EMBEDDINGS, {"input": ["fine", "the secret"]}, id="embedding-list"),
]


def _harmless(body: dict[str, Any]) -> dict[str, Any]:
    loaded = orjson.loads(orjson.dumps(body).replace(b"secret", b"public"))
    assert isinstance(loaded, dict)
    return loaded


@pytest.mark.parametrize(("path", "body"), TEXT_SHAPES)
def test_a_secret_in_any_text_shape_is_blocked(shapes: Shapes, path: str, body: dict) -> None:
    """GIVEN a use case that blocks "secret" on requests WHEN the word is in any text the
    model reads THEN 400 guardrail_blocked; the same body without it goes through (200)."""
    blocked = shapes.post(shapes.guarded, path, {**body, "max_tokens": 2})
    assert blocked.status_code == 400, blocked.text
    assert blocked.json()["error"]["code"] == "guardrail_blocked"
    harmless = shapes.post(shapes.guarded, path, {**_harmless(body), "max_tokens": 2})
    assert harmless.status_code == 200, harmless.text


# Shapes the gateway cannot read as text: (path, body, the param the 400 names).
UNREADABLE = [
    pytest.param(
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "bogus", "text": "a secret"}]}]},
        "messages[0].content[0]",
        id="chat-unknown-part-type",
    ),
    pytest.param(
        CHAT,
        {"messages": [{"role": "user", "content": [{"text": "a secret"}]}]},
        "messages[0].content[0]",
        id="chat-part-without-type",
    ),
    pytest.param(
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text", "text": ["a secret"]}]}]},
        "messages[0].content[0].text",
        id="chat-text-part-not-a-string",
    ),
    pytest.param(
        CHAT,
        {"messages": [{"role": "user", "content": ["fine", 42]}]},
        "messages[0].content[1]",
        id="chat-part-a-number",
    ),
    pytest.param(
        CHAT,
        {"messages": [{"role": "user", "content": {"text": "a secret"}}]},
        "messages[0].content",
        id="chat-content-an-object",
    ),
    pytest.param(
        CHAT,
        {"messages": ["a secret"]},
        "messages[0]",
        id="chat-message-not-an-object",
    ),
    pytest.param(
        CHAT,
        {
            "messages": [
                {"role": "user", "content": "look it up"},
                {"role": "assistant", "tool_calls": [_tool_call({"query": "a secret"})]},
            ]
        },
        "messages[1].tool_calls[0].function.arguments",
        id="chat-tool-call-arguments-an-object",
    ),
    pytest.param(
        CHAT,
        {"messages": [{"role": "user", "content": "hi"}], "documents": {"text": "a secret"}},
        "documents",
        id="chat-documents-an-object",
    ),
    pytest.param(
        CHAT,
        {"messages": [{"role": "user", "content": "hi"}], "documents": [{"text": ["a secret"]}]},
        "documents[0].text",
        id="chat-document-text-not-a-string",
    ),
    pytest.param(COMPLETIONS, {"prompt": [1, 2, 3]}, "prompt", id="completion-token-ids"),
    pytest.param(
        COMPLETIONS, {"prompt": [[1, 2], [3]]}, "prompt[0]", id="completion-token-id-lists"
    ),
    pytest.param(COMPLETIONS, {"prompt": ["fine", [1, 2]]}, "prompt[1]", id="completion-mixed"),
    pytest.param(
        COMPLETIONS,
        {"prompt": "fine", "prompt_embeds": "AAAA"},
        "prompt_embeds",
        id="completion-prompt-embeds",
    ),
    pytest.param(EMBEDDINGS, {"input": [1, 2, 3]}, "input", id="embedding-token-ids"),
    pytest.param(EMBEDDINGS, {"input": [[1, 2], [3]]}, "input[0]", id="embedding-token-id-lists"),
    pytest.param(EMBEDDINGS, {"input": {"text": "a secret"}}, "input", id="embedding-an-object"),
]


@pytest.mark.parametrize(("path", "body", "param"), UNREADABLE)
def test_what_cannot_be_read_as_text_is_refused_under_a_request_guardrail(
    shapes: Shapes, path: str, body: dict, param: str
) -> None:
    """GIVEN a use case with a request guardrail WHEN the body holds something the model
    reads but the gateway cannot read as text THEN 400 unreadable_content, OpenAI-shaped,
    naming where it is; nothing reaches the model."""
    response = shapes.post(shapes.guarded, path, {**body, "max_tokens": 2})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "unreadable_content"
    assert error["param"] == param
    assert "guardrail" in error["message"]
    assert "text" in error["message"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param(COMPLETIONS, {"prompt": [1, 2, 3]}, id="completion-token-ids"),
        pytest.param(EMBEDDINGS, {"input": [[1, 2], [3]]}, id="embedding-token-id-lists"),
    ],
)
def test_token_ids_still_go_through_without_a_request_guardrail(
    shapes: Shapes, path: str, body: dict
) -> None:
    """The refusal is the guardrail's: a use case without one sends token ids as before."""
    response = shapes.post(shapes.plain, path, {**body, "max_tokens": 2})
    assert response.status_code == 200, response.text


def test_redaction_rewrites_bare_strings_in_a_content_list(shapes: Shapes) -> None:
    """GIVEN redact WHEN an assistant message's content is a list of bare strings THEN the
    replica reads them redacted (the simulator's chat echo shows the last assistant text)."""
    response = shapes.post(
        shapes.redacting,
        CHAT,
        {
            "echo": True,
            "max_tokens": 2,
            "messages": [
                {"role": "user", "content": "a question"},
                {"role": "assistant", "content": ["The secret is", "not secret at all"]},
            ],
        },
    )
    assert response.status_code == 200, response.text
    echoed = response.json()["choices"][0]["message"]["content"]
    assert echoed.startswith("The <WORD> is\nnot <WORD> at all"), echoed


def test_the_async_door_reads_the_same_shapes(shapes: Shapes) -> None:
    """The async submit runs the same request guardrails: a secret in a list of bare
    strings is blocked, token ids under a guardrail are refused, nothing is queued."""
    secret = {"model": MODEL, "messages": [{"role": "user", "content": ["the secret"]}]}
    blocked = httpx.post(
        shapes.base_url + "/v1/async/chat/completions",
        json=secret,
        headers={"authorization": f"Bearer {shapes.guarded}"},
        timeout=30,
    )
    assert blocked.status_code == 400, blocked.text
    assert blocked.json()["error"]["code"] == "guardrail_blocked"
    ids = httpx.post(
        shapes.base_url + "/v1/async/completions",
        json=[{"model": MODEL, "prompt": "fine"}, {"model": MODEL, "prompt": [1, 2, 3]}],
        headers={"authorization": f"Bearer {shapes.guarded}"},
        timeout=30,
    )
    assert ids.status_code == 400, ids.text
    error = ids.json()["error"]
    assert (error["code"], error["param"]) == ("unreadable_content", "[1].prompt")


# --- answers: tool-call arguments are text for the response guardrails ----------------------
def test_an_answers_tool_call_arguments_refusal_and_reasoning_are_its_texts() -> None:
    """A whole chat answer's texts, as the response stage reads them: the content, the
    refusal, the reasoning, and every tool call's arguments."""
    from guardrails.texts import answer_slots  # new with the fix: imported here, not above

    answer = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "calling",
                    "refusal": "no",
                    "reasoning_content": "thinking",
                    "tool_calls": [
                        _tool_call('{"a": 1}'),
                        {**_tool_call('{"b": 2}'), "id": "call_2"},
                    ],
                },
            }
        ]
    }
    texts = [container[key] for container, key, _ in answer_slots(CHAT, answer)]
    assert texts == ["calling", "no", "thinking", '{"a": 1}', '{"b": 2}']
    completion = {"choices": [{"index": 0, "text": "plain"}]}
    assert [c[k] for c, k, _ in answer_slots(COMPLETIONS, completion)] == ["plain"]


def _event(document: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(document) + b"\n\n"


def _tool_stream(fragments: list[str]) -> bytes:
    """A streamed answer that calls a tool, its arguments cut in ``fragments`` (as vLLM
    streams them: the first delta names the call, the next ones add to its arguments)."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def delta(content: dict[str, Any], finish: str | None = None) -> bytes:
        return _event(
            {**head, "choices": [{"index": 0, "delta": content, "finish_reason": finish}]}
        )

    events = [delta({"role": "assistant", "content": ""})]
    events.append(delta({"tool_calls": [{**_tool_call(""), "index": 0}]}))
    events += [
        delta({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        for piece in fragments
    ]
    events.append(delta({}, "tool_calls"))
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


async def _relay(url: str, raw: bytes, action: str) -> tuple[bytes, bool]:
    checks = StageChecks("response", (CheckSpec("words", action, SECRET),), ())
    async with service_guardrails(url) as guardrails:
        stream = GuardedStream(
            path=CHAT,
            checks=checks,
            guardrails=guardrails,
            window_chars=16,
            failure="closed",
            strip_usage=False,
            document={},
        )
        out = [await stream.feed(raw[i : i + 7]) for i in range(0, len(raw), 7)]
        out.append(await stream.finish())
    return b"".join(out), stream.ended


def _arguments(out: bytes) -> str:
    """The tool call's arguments as a client accumulates them from the stream."""
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    arguments = []
    for event in events[:-1]:
        for choice in orjson.loads(event.removeprefix(b"data: "))["choices"]:
            for call in choice["delta"].get("tool_calls") or ():
                arguments.append(call.get("function", {}).get("arguments") or "")
    return "".join(arguments)


FRAGMENTS = ['{"query": "the sec', 'ret plan", "more": "', "x" * 40, ' secret"}']


def test_streamed_tool_call_arguments_are_redacted_across_fragments(shapes: Shapes) -> None:
    """GIVEN a response guardrail that redacts WHEN a streamed answer's tool-call arguments
    hold the word, cut across deltas THEN the client accumulates them redacted."""
    out, ended = asyncio.run(_relay(shapes.guardrail_url, _tool_stream(FRAGMENTS), "redact"))
    assert not ended
    expected = re.sub(r"\bsecret\b", "<WORD>", "".join(FRAGMENTS))
    assert _arguments(out) == expected
    assert b'"finish_reason":"tool_calls"' in out


def test_streamed_tool_call_arguments_are_blocked(shapes: Shapes) -> None:
    out, ended = asyncio.run(_relay(shapes.guardrail_url, _tool_stream(FRAGMENTS), "block"))
    assert ended
    assert b"guardrail_blocked" in out
    assert b"secret" not in out


async def _check_whole(url: str, path: str, body: bytes, action: str) -> bytes:
    """A whole answer through the response stage every door shares (gateway/response_stage.py),
    against the real guardrail service."""
    checks = StageChecks("response", (CheckSpec("words", action, SECRET),), ())
    guard = GuardPlan(request=None, response=checks, failure="closed", window_chars=16)
    async with service_guardrails(url) as guardrails:
        return await check_answer(
            guardrails, Subject(), path=path, guard=guard, body=body, document={},
            policy_version=1,
        )  # fmt: skip


def test_a_transcript_is_checked_in_every_shape_and_an_answer_that_is_not_json_whole(
    shapes: Shapes,
) -> None:
    """A transcription's text, its segments and words are the answer's texts; an answer that is
    not JSON (plain text, SRT) is checked as one text rather than let through unread."""
    path = "/v1/audio/transcriptions"
    verbose = orjson.dumps(
        {
            "text": "the secret plan",
            "segments": [{"id": 0, "text": "the secret plan"}],
            "words": [{"word": "secret", "start": 0.1, "end": 0.4}],
        }
    )
    redacted = orjson.loads(
        asyncio.run(_check_whole(shapes.guardrail_url, path, verbose, "redact"))
    )
    assert "secret" not in orjson.dumps(redacted).decode()
    assert redacted["segments"][0]["text"] == redacted["text"]
    plain = b"1\n00:00:00,000 --> 00:00:02,000\nthe secret plan\n"
    out = asyncio.run(_check_whole(shapes.guardrail_url, path, plain, "redact"))
    assert b"secret" not in out
    assert out.startswith(b"1\n00:00:00,000 --> 00:00:02,000\nthe ")
    with pytest.raises(GatewayError) as blocked:
        asyncio.run(_check_whole(shapes.guardrail_url, CHAT, b"a secret, not JSON", "block"))
    assert blocked.value.status == 422
