"""Schemathesis over the gateway's /v1 (issue 24, "Fuzzing the doors"): every operation of its
OpenAPI document (gateway/openapi.yaml, served at /v1/openapi.json), with generated input,
against a live gateway.

Against real processes, started once for the module (testkit/module_stack.py): Valkey,
vLLM simulators for chat, embeddings and transcription, the fleet watcher, the guardrail
service (the ``words`` test detector) and a gateway. Each case is sent with two real keys:
"guarded", whose use case blocks the word ``MARKER`` on requests, and "plain", which has no
guardrail.

What must hold for every case: no 5xx but the backpressure the document declares (503 with
Retry-After); every error in OpenAI's shape; the answer as the document says (status code,
content type, headers, body); and the control matrix: a request whose model-read text holds
the blocked word is never answered 2xx for the guarded key.

Files and batches are described in the document but served by the web process (the gateway
only forwards them, gateway/control_proxy.py): they are not fuzzed here; their routes and the
proxy's path checks have tests of their own (tests/scheduler/files/test_openai_batch_sdk.py,
tests/security/test_control_proxy_paths.py).

Deterministic for CI: a fixed seed, derandomized, no example database, no deadlines.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import hypothesis
import orjson
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis import checks

from gateway import openapi
from testkit.module_stack import module_stack
from testkit.policy import PolicyBuilder

# Cases per operation; each is sent once per key. Keeps the whole run to about a minute.
MAX_EXAMPLES = 20
MARKER = "swordfish"  # the request guardrail of "guarded" blocks it
_MARKED = re.compile(rf"\b{MARKER}\b", re.IGNORECASE)  # as the words detector finds it
_WORDS: dict[str, object] = {"words": [MARKER]}
CHAT, EMBED, WHISPER = "llama-fuzz", "embed-fuzz", "whisper-fuzz"
# The model each operation's body names, when it names one that exists.
MODELS = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": CHAT,
    "/v1/embeddings": EMBED,
    "/v1/audio/transcriptions": WHISPER,
    "/v1/async/chat/completions": CHAT,
    "/v1/async/completions": CHAT,
    "/v1/async/embeddings": EMBED,
}

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": 24,
        # The key is sent by the test: no generated Authorization headers.
        "generation": {
            "mode": "positive",
            "database": "none",
            "with-security-parameters": False,
        },
        "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
    }
)

# The document as the gateway serves it (the same loader); test_the_document_is_served holds
# the served bytes to it.
schema = schemathesis.openapi.from_dict(orjson.loads(openapi.load()), config=CONFIG).exclude(
    path_regex=r"^/v1/(files|batches)"
)


def no_server_error_but_backpressure(
    ctx: Any, response: schemathesis.Response, case: schemathesis.Case
) -> None:
    """No 5xx, but a 503 that tells the client when to come back (a full queue, a
    guardrail check that could not run, a full async backlog)."""
    if response.status_code == 503:
        assert "retry-after" in {k.lower() for k in response.headers}, response.text
    else:
        assert response.status_code < 500, response.text


def openai_error_shape(ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """Every error is OpenAI's ``{"error": {"message", "type", "param", "code"}}``: what the
    SDKs read."""
    if response.status_code < 400:
        return
    document = orjson.loads(response.content)
    assert isinstance(document, dict), response.text
    error = document.get("error")
    assert isinstance(error, dict), response.text
    assert isinstance(error.get("message"), str), response.text
    assert isinstance(error.get("type"), str) or error.get("code") is not None, response.text


CHECKS = [
    no_server_error_but_backpressure,
    openai_error_shape,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]


@dataclass
class Stack:
    base_url: str
    guarded: str
    plain: str


# Ids of tasks that exist, by key: half the polls address one (filled by ``stack``).
TASKS: dict[str, str] = {}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with module_stack(guardrail_service=True) as running:
        fast = ("--time-scale", "0")
        chat = running.simulator(CHAT, *fast)
        embed = running.simulator(EMBED, "--kind", "embedding", *fast)
        whisper = running.simulator(WHISPER, "--kind", "transcription", *fast)
        policy = PolicyBuilder()
        policy.model(CHAT, [chat], capabilities=("chat", "completions"))
        policy.model(EMBED, [embed], capabilities=("embeddings",))
        policy.model(WHISPER, [whisper], capabilities=("transcription",))
        guarded = policy.key(use_case="guarded")
        policy.guardrail(guarded, "words", side="request", action="block", config=_WORDS)
        plain = policy.key(use_case="plain")
        base_url = running.gateway(policy)
        for key in (guarded, plain):
            queued = httpx.post(
                base_url + "/v1/async/completions",
                json={"model": CHAT, "prompt": "hello"},
                headers={"authorization": f"Bearer {key}"},
                timeout=30,
            )
            assert queued.status_code == 202, queued.text
            TASKS[key] = queued.json()["id"]
        try:
            yield Stack(base_url, guarded, plain)
        finally:
            TASKS.clear()


@schema.hook
def flatmap_path_parameters(
    context: schemathesis.HookContext, path_parameters: dict[str, Any] | None
) -> st.SearchStrategy[dict[str, Any] | None]:
    """Half the polls name a task that exists (of one key or the other: the other key's
    must read as a 404)."""
    if not path_parameters or "task_id" not in path_parameters or not TASKS:
        return st.just(path_parameters)
    real = st.sampled_from(sorted(TASKS.values())).map(lambda task: {"task_id": task})
    return st.one_of(st.just(path_parameters), real)


@schema.hook
def map_query(context: schemathesis.HookContext, query: dict[str, Any] | None) -> Any:
    """A poll waits at most half a second: no batcher runs here, so a queued task would hold
    the poll for its whole ``wait`` (up to a minute), which says nothing more."""
    if query and isinstance(query.get("wait"), int | float) and query["wait"] > 0.5:
        query["wait"] = 0.5
    return query


@schema.hook
def flatmap_body(context: schemathesis.HookContext, body: Any) -> st.SearchStrategy[Any]:
    """Most bodies name a model that exists (the operation's own, or one without the
    capability), and half carry the blocked word in a text the model reads.

    Without the first nearly every request is a 404 for an unknown model and the guardrail,
    the admission and the relay behind it never run; without the second the control matrix
    is never put to the test."""
    assert context.operation is not None
    model = MODELS.get(context.operation.path)
    if model is None:
        return st.just(body)
    # Drawn first (the shrinker's favourite), and most often: the operation's own model.
    # None keeps the generated name (an unknown model: 404); the others lack the capability.
    models = st.sampled_from([model, model, model, model, None, CHAT, EMBED, WHISPER])
    if isinstance(body, list):
        return st.tuples(*(_one_body(item, models) for item in body)).map(list)
    return _one_body(body, models)


def _one_body(body: Any, models: st.SearchStrategy[str | None]) -> st.SearchStrategy[Any]:
    if not isinstance(body, dict):
        return st.just(body)
    return st.tuples(models, st.booleans()).map(
        lambda choice: _with(body, model=choice[0], marked=choice[1])
    )


def _with(body: dict[str, Any], *, model: str | None, marked: bool) -> dict[str, Any]:
    changed = dict(body)
    if model is not None:
        changed["model"] = model
    if marked:
        _mark(changed)
    return changed


def _mark(body: dict[str, Any]) -> None:
    """Put the blocked word where the model reads it: the last message, the prompt, the
    input (or, for an upload, its prompt field)."""
    tail = f" {MARKER}"
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        last = messages[-1] = dict(messages[-1])
        content = last.get("content")
        if isinstance(content, list) and content and isinstance(content[0], dict):
            last["content"] = [{**content[0], "text": f"{content[0].get('text', '')}{tail}"}]
        else:
            last["content"] = f"{content if isinstance(content, str) else ''}{tail}"
        return
    for field in ("prompt", "input"):
        value = body.get(field)
        if isinstance(value, str):
            body[field] = value + tail
        elif isinstance(value, list) and value and isinstance(value[0], str):
            body[field] = [value[0] + tail, *value[1:]]


def _read_texts(body: Any) -> Iterator[str]:
    """The texts of a JSON body that the model reads, as the OpenAI API defines them (not as
    the gateway reads them: that is what is under test)."""
    if isinstance(body, list):
        for item in body:
            yield from _read_texts(item)
        return
    if not isinstance(body, dict):
        return
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, str):
                    yield part
                elif isinstance(part, dict) and isinstance(part.get("text"), str):
                    yield part["text"]
    for field in ("prompt", "input"):
        value = body.get(field)
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            yield from (item for item in value if isinstance(item, str))


def test_the_document_is_served(stack: Stack) -> None:
    """GIVEN a running gateway WHEN anyone (no key) asks for /v1/openapi.json THEN it answers
    the document this module fuzzes, as JSON."""
    response = httpx.get(stack.base_url + openapi.PATH, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.content == openapi.load()
    assert set(response.json()["paths"]) >= {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/audio/transcriptions",
        "/v1/async/chat/completions",
        "/v1/tasks/{task_id}",
        "/v1/models",
        "/v1/files",
        "/v1/batches",
    }


@schema.parametrize()
@hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)
def test_the_gateway_answers_as_its_document_says(case: schemathesis.Case, stack: Stack) -> None:
    for key in (stack.guarded, stack.plain):
        response = case.call_and_validate(
            base_url=stack.base_url,
            headers={"authorization": f"Bearer {key}"},
            checks=CHECKS,
            timeout=60,
        )
        if key == stack.guarded and any(_MARKED.search(text) for text in _read_texts(case.body)):
            # The control matrix: the request guardrail's block holds on every door.
            assert not 200 <= response.status_code < 300, (
                f"{case.method} {case.path} with the blocked word answered "
                f"{response.status_code}: {response.text[:500]}"
            )
