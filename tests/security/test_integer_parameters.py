"""Issue 24, defect 3: ``max_tokens``, ``max_completion_tokens``, ``n`` and ``best_of`` are
integers (not booleans) or the request is refused with a 400 naming the parameter. vLLM
reads "100000" or 5.0 as numbers, while the gateway's cap on a model's completion and its
token estimate read only integers: given as a string or a float, a bound went to the replica
uncapped and unestimated.

Against real processes, started once for the module (testkit/module_stack.py): a
gateway, its fleet watcher, the vLLM simulator and Valkey. The model's cap (the officer's
``max_tokens``) is 8.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from testkit.module_stack import module_stack
from testkit.policy import PolicyBuilder

MODEL = "llama-integers"
CAP = 8
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
BODIES: dict[str, dict[str, Any]] = {
    CHAT: {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    COMPLETIONS: {"model": MODEL, "prompt": "hi"},
}


@dataclass
class Integers:
    base_url: str
    key: str

    def post(self, path: str, body: Any) -> httpx.Response:
        return httpx.post(
            self.base_url + path,
            json=body,
            headers={"authorization": f"Bearer {self.key}"},
            timeout=30,
        )


@pytest.fixture(scope="module")
def integers() -> Iterator[Integers]:
    with module_stack() as stack:
        replica = stack.simulator(MODEL, "--time-scale", "0")
        policy = PolicyBuilder().model(MODEL, [replica], max_tokens=CAP)
        key = policy.key(use_case="capped")
        yield Integers(stack.gateway(policy), key)


def _assert_names(response: httpx.Response, param: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["code"] == "invalid_type"
    assert "integer" in error["message"]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens", "n", "best_of"])
@pytest.mark.parametrize("value", ["100000", 5.0, 1e5, True, [5]], ids=repr)
def test_a_count_that_is_not_an_integer_is_refused_naming_it(
    integers: Integers, path: str, name: str, value: object
) -> None:
    """GIVEN a model capped at 8 tokens WHEN a request gives a count as a string, a float,
    a boolean or a list THEN 400 naming the parameter: nothing reaches the replica."""
    _assert_names(integers.post(path, {**BODIES[path], name: value}), name)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_integers_and_null_still_go_through_under_the_cap(integers: Integers, path: str) -> None:
    """An integer bound above the cap is lowered to it, as before; null is no bound."""
    response = integers.post(path, {**BODIES[path], "max_tokens": 100_000, "n": 2})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert len(answer["choices"]) == 2
    assert answer["usage"]["completion_tokens"] <= 2 * CAP
    unbounded = integers.post(path, {**BODIES[path], "max_tokens": None, "n": None})
    assert unbounded.status_code == 200, unbounded.text
    assert unbounded.json()["usage"]["completion_tokens"] <= CAP


@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens", "n", "best_of"])
def test_the_async_door_refuses_the_same(integers: Integers, name: str) -> None:
    """The async submit checks each body as the synchronous endpoint does: one body names
    the parameter, a bulk submit names the body too."""
    single = integers.post("/v1/async/chat/completions", {**BODIES[CHAT], name: "100000"})
    _assert_names(single, name)
    bulk = integers.post(
        "/v1/async/completions", [BODIES[COMPLETIONS], {**BODIES[COMPLETIONS], name: 5.0}]
    )
    _assert_names(bulk, f"[1].{name}")
