"""A deprecated model's lifecycle at a real gateway (docs/models.md): notices before its
sunset, then a 410 naming the successor or the successor serving under the old id.

One stack for the module (testkit/module_stack.py): Valkey, one simulator replica, the
guardrail service (for answers checked before they are sent), a fleet watcher, a gateway and a
batcher. The models all run on that replica under its served name;
what differs is the lifecycle the snapshot publishes. The gateway decides by its own clock
from the snapshot: nothing here retires a model in a database.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

import httpx
import orjson
import pytest
import valkey

from gateway.accounting import USAGE_STREAM
from ops.processes import wait_until
from testkit.async_tasks import wait_ended
from testkit.module_stack import module_stack
from testkit.policy import PolicyBuilder

SERVED = "sim-chat"
NEW = "chat-v2"  # the successor
OLD = "chat-v1"  # deprecated, sunset tomorrow
GONE = "chat-v0"  # past its sunset, refused
MOVED = "chat-v0-moved"  # past its sunset, served by the successor
RETIRED = "chat-legacy"  # retired, no deployment left
NOTICE = "https://docs.example.com/models/chat-v1-sunset"
DEPRECATED_AT = 1_790_000_000
SUNSET_AT = float(int(time.time()) + 86_400)


@dataclass
class Lifecycle:
    url: str
    key: str  # approved for the old ids
    fresh: str  # approved for the successor
    checked: str  # approved for the old ids, its answers checked by a response guardrail
    valkey: valkey.Valkey


@pytest.fixture(scope="module")
def lifecycle() -> Iterator[Lifecycle]:
    with module_stack(guardrail_service=True) as stack:
        replica = stack.simulator(SERVED, "--time-scale", "0")
        policy = PolicyBuilder().priority_class("prod", rank=0).priority_class("batch", rank=4)
        for name in (NEW, OLD, GONE, MOVED):
            policy.model(name, [replica], served_name=SERVED)
        policy.model(RETIRED, [], served_name=RETIRED)
        past = time.time() - 60
        policy.lifecycle(
            OLD, sunset_at=SUNSET_AT, successor=NEW, notice_url=NOTICE, deprecated_at=DEPRECATED_AT
        )
        policy.lifecycle(GONE, sunset_at=past, successor=NEW, notice_url=NOTICE)
        policy.lifecycle(MOVED, sunset_at=past, successor=NEW, at_sunset="successor")
        policy.lifecycle(RETIRED, status="retired", sunset_at=past, successor=NEW)
        # Approved for the old ids only: the successor serves under an id the use case may
        # call, not because the use case may call the successor itself.
        key = policy.key(use_case="chatbot", models=[OLD, GONE, MOVED, RETIRED])
        fresh = policy.key(use_case="assistant", models=[NEW])
        checked = policy.key(use_case="guarded", models=[OLD])
        policy.guardrail(checked, "words", side="response", config={"words": ["secret"]})
        url = stack.gateway(policy)
        stack.batcher()
        yield Lifecycle(url, key, fresh, checked, stack.valkey)


def post(
    world: Lifecycle, path: str, body: dict[str, Any], key: str | None = None
) -> httpx.Response:
    return httpx.post(
        world.url + path,
        content=orjson.dumps(body),
        headers={
            "authorization": f"Bearer {key or world.key}",
            "content-type": "application/json",
        },
        timeout=30,
    )


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
    } | extra


def assert_notices(response: httpx.Response) -> None:
    assert response.headers["deprecation"] == f"@{DEPRECATED_AT}"
    assert response.headers["sunset"] == formatdate(SUNSET_AT, usegmt=True)
    assert response.headers.get_list("link") == [
        f'<{NOTICE}>; rel="deprecation"; type="text/html"',
        f'<{NOTICE}>; rel="sunset"; type="text/html"',
    ]


def test_the_model_list_leaves_out_what_would_be_refused(lifecycle: Lifecycle) -> None:
    listed = httpx.get(
        lifecycle.url + "/v1/models",
        headers={"authorization": f"Bearer {lifecycle.key}"},
        timeout=30,
    )
    assert sorted(m["id"] for m in listed.json()["data"]) == sorted([OLD, MOVED])


def test_an_active_model_carries_no_notice(lifecycle: Lifecycle) -> None:
    answer = post(lifecycle, "/v1/chat/completions", chat(NEW), key=lifecycle.fresh)
    assert answer.status_code == 200, answer.text
    assert not {"deprecation", "sunset", "link", "x-switchyard-served-model"} & set(answer.headers)


def test_the_successor_is_not_a_way_around_the_approval_of_its_own_id(
    lifecycle: Lifecycle,
) -> None:
    """The old id's approval lets its callers reach the successor through it, not by name."""
    answer = post(lifecycle, "/v1/chat/completions", chat(NEW))
    assert answer.status_code == 403, answer.text


def test_before_its_sunset_a_deprecated_model_answers_with_its_notices(
    lifecycle: Lifecycle,
) -> None:
    answer = post(lifecycle, "/v1/chat/completions", chat(OLD))
    assert answer.status_code == 200, answer.text
    assert_notices(answer)
    assert "x-switchyard-served-model" not in answer.headers


def test_a_streamed_answer_carries_the_notices(lifecycle: Lifecycle) -> None:
    with httpx.stream(
        "POST",
        lifecycle.url + "/v1/chat/completions",
        content=orjson.dumps(chat(OLD, stream=True)),
        headers={"authorization": f"Bearer {lifecycle.key}", "content-type": "application/json"},
        timeout=30,
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        assert_notices(answer)
        assert b"[DONE]" in answer.read()


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_checked_by_response_guardrails_carries_the_notices(
    lifecycle: Lifecycle, stream: bool
) -> None:
    with httpx.stream(
        "POST",
        lifecycle.url + "/v1/chat/completions",
        content=orjson.dumps(chat(OLD, stream=stream)),
        headers={
            "authorization": f"Bearer {lifecycle.checked}",
            "content-type": "application/json",
        },
        timeout=30,
    ) as answer:
        assert answer.status_code == 200
        assert_notices(answer)
        answer.read()


def test_an_async_submit_carries_the_notices(lifecycle: Lifecycle) -> None:
    submitted = post(lifecycle, "/v1/async/chat/completions", chat(OLD))
    assert submitted.status_code == 202, submitted.text
    assert_notices(submitted)


@pytest.mark.parametrize(
    ("path", "model"),
    [
        ("/v1/chat/completions", GONE),
        ("/v1/async/chat/completions", GONE),
        ("/v1/chat/completions", RETIRED),
        ("/v1/async/chat/completions", RETIRED),
    ],
)
def test_past_its_sunset_a_model_is_gone_and_the_answer_names_its_successor(
    lifecycle: Lifecycle, path: str, model: str
) -> None:
    answer = post(lifecycle, path, chat(model))
    assert answer.status_code == 410, answer.text
    error = answer.json()["error"]
    assert error == {
        "message": f"The model '{model}' has been retired. Use '{NEW}' instead.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_retired",
    }
    assert "sunset" in answer.headers  # the date it ended, as the notices said


def _usage_model(client: valkey.Valkey, record_id: str) -> bytes | None:
    for _, fields in client.xrange(USAGE_STREAM):
        if fields.get(b"record_id") == record_id.encode():
            return fields[b"model"]
    return None


def test_past_its_sunset_the_successor_serves_under_the_old_id_and_the_record_names_it(
    lifecycle: Lifecycle,
) -> None:
    answer = post(lifecycle, "/v1/chat/completions", chat(MOVED))
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-switchyard-served-model"] == NEW
    assert answer.headers["deprecation"].startswith("@")
    record_id = answer.headers["x-switchyard-record-id"]
    assert wait_until(lambda: _usage_model(lifecycle.valkey, record_id) is not None)
    assert _usage_model(lifecycle.valkey, record_id) == NEW.encode()


def test_an_async_task_past_the_sunset_runs_on_the_successor(lifecycle: Lifecycle) -> None:
    submitted = post(lifecycle, "/v1/async/chat/completions", chat(MOVED))
    assert submitted.status_code == 202, submitted.text
    assert submitted.headers["x-switchyard-served-model"] == NEW
    [ended] = wait_ended(lifecycle.valkey, [submitted.json()["id"]], timeout=60)
    assert ended["status"] == "done", ended
    assert ended["model"] == NEW, ended


def test_the_successor_must_offer_what_the_endpoint_needs(lifecycle: Lifecycle) -> None:
    """The capability checked is the successor's: it serves, not the old model."""
    answer = post(lifecycle, "/v1/embeddings", {"model": MOVED, "input": "hello"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "unsupported_capability"


def test_a_task_queued_before_the_sunset_and_run_after_it_follows_the_sunset_rule() -> None:
    """GIVEN two deprecated models whose sunset is seconds away, one refused after it and one
    moved to the successor, and no batcher running WHEN a task for each is queued before the
    sunset and a batcher starts after it THEN the first fails with 410 model_retired naming
    the successor, and the second is served by the successor, whose id its usage records."""
    # Far enough ahead that a loaded machine starts the simulator and the gateway and
    # queues both tasks before it (2 s was not, on a fresh checkout's first run).
    soon = time.time() + 10
    with module_stack() as stack:
        replica = stack.simulator(SERVED, "--time-scale", "0")
        policy = PolicyBuilder().priority_class("prod", rank=0).priority_class("batch", rank=4)
        for name in (NEW, OLD, MOVED):
            policy.model(name, [replica], served_name=SERVED)
        policy.lifecycle(OLD, sunset_at=soon, successor=NEW)
        policy.lifecycle(MOVED, sunset_at=soon, successor=NEW, at_sunset="successor")
        key = policy.key(use_case="chatbot", models=[OLD, MOVED])
        world = Lifecycle(stack.gateway(policy), key, key, key, stack.valkey)
        queued = {}
        for name in (OLD, MOVED):
            submitted = post(world, "/v1/async/chat/completions", chat(name))
            assert submitted.status_code == 202, submitted.text
            assert "x-switchyard-served-model" not in submitted.headers  # before the sunset
            queued[name] = submitted.json()["id"]
        assert time.time() < soon, "queued after the sunset: the premise does not hold"
        assert wait_until(lambda: time.time() > soon + 0.5, timeout=15)
        stack.batcher()

        refused, moved = wait_ended(stack.valkey, [queued[OLD], queued[MOVED]], timeout=60)
        assert refused["status"] == "failed", refused
        assert refused["error"]["code"] == "model_retired", refused
        assert f"Use '{NEW}' instead" in refused["error"]["message"]
        assert moved["status"] == "done", moved

        def usage() -> list[dict[bytes, bytes]]:
            return [
                fields
                for _, fields in stack.valkey.xrange(USAGE_STREAM)
                if fields.get(b"record_id") == queued[MOVED].encode()
            ]

        assert wait_until(lambda: bool(usage()), timeout=15)
        assert usage()[0][b"model"] == NEW.encode()
