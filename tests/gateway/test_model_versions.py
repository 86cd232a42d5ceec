"""A model's versions at a real gateway (issue 27; docs/models.md, "Versions"): the split,
aliases, pins and what the answer and the usage say served.

One stack for the module (testkit/module_stack.py): Valkey, two simulator replicas (one per
version, each serving under its own name, so an answer's ``model`` says which replica wrote
it), a fleet watcher, a gateway and a batcher. The snapshot is what governance publishes for
a model with versions (tests/governance/test_model_versions.py holds that side).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
import valkey

from testkit.async_tasks import wait_ended
from testkit.module_stack import module_stack
from testkit.policy import PolicyBuilder
from testkit.usage_stream import usage_models

CANARY = "chat"  # 95/5 between v1 and v2, per request
STICKY = "summary"  # 50/50, sticky per use case
SERVED = {"v1": "sim-v1", "v2": "sim-v2"}
SPLIT_REQUESTS = 2_000
STICKY_USE_CASES = 12


@dataclass
class Versions:
    url: str
    key: str  # may call both models
    pinned: str  # pinned to chat@stable (v1)
    other: str  # may call neither
    sticky: list[str]  # one key per use case, for the sticky model
    limited: str  # its use case calls a model whose rate limit spans versions
    valkey: valkey.Valkey


@pytest.fixture(scope="module")
def world() -> Iterator[Versions]:
    with module_stack() as stack:
        replicas = {v: stack.simulator(name, "--time-scale", "0") for v, name in SERVED.items()}
        policy = PolicyBuilder().priority_class("prod", rank=0)
        policy.versions(
            CANARY,
            {v: [url] for v, url in replicas.items()},
            split={"v1": 95, "v2": 5},
            aliases={"stable": "v1", "preview": "v2"},
            served_names=SERVED,
        )
        policy.versions(
            STICKY,
            {v: [url] for v, url in replicas.items()},
            split={"v1": 50, "v2": 50},
            sticky="use_case",
            served_names=SERVED,
        )
        policy.versions("limited", {v: [url] for v, url in replicas.items()}, served_names=SERVED)
        policy.rate_limit("three-a-minute", "model", model="limited", requests_per_minute=3)
        key = policy.key(use_case="chatbot", models=[CANARY, STICKY])
        pinned = policy.key(use_case="steady", models=[CANARY])
        policy.pin(pinned, CANARY, "stable")
        other = policy.key(use_case="elsewhere", models=[STICKY])
        sticky = [policy.key(use_case=f"team-{i}", models=[STICKY]) for i in range(12)]
        limited = policy.key(use_case="limited", models=["limited"])
        url = stack.gateway(policy)
        stack.batcher()
        yield Versions(url, key, pinned, other, sticky, limited, stack.valkey)


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def post(client: httpx.Client, world: Versions, key: str, body: dict[str, Any]) -> httpx.Response:
    return client.post(
        world.url + "/v1/chat/completions",
        content=orjson.dumps(body),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )


def served_version(answer: httpx.Response) -> str:
    """The version the answer says served, checked against the replica that wrote it."""
    assert answer.status_code == 200, answer.text
    version = answer.headers["x-switchyard-model-version"]
    assert answer.json()["model"] == SERVED[version], (version, answer.json()["model"])
    return version


def test_a_95_5_split_holds_over_2000_requests(world: Versions) -> None:
    """GIVEN chat split 95/5 per request WHEN 2,000 requests name it THEN v2 serves 5% of
    them within ±2% (the smooth round robin makes it exact), each answer written by the
    replica of the version its header names."""
    with httpx.Client(timeout=30) as client:
        served = Counter(
            served_version(post(client, world, world.key, chat(CANARY)))
            for _ in range(SPLIT_REQUESTS)
        )
    assert abs(served["v2"] / SPLIT_REQUESTS - 0.05) <= 0.02, served
    assert served["v1"] + served["v2"] == SPLIT_REQUESTS


def test_a_version_or_an_alias_pins_the_request(world: Versions) -> None:
    with httpx.Client(timeout=30) as client:
        for name, version in (
            (f"{CANARY}@v2", "v2"),
            (f"{CANARY}@preview", "v2"),
            (f"{CANARY}@v1", "v1"),
            (f"{CANARY}@stable", "v1"),
        ):
            assert {
                served_version(post(client, world, world.key, chat(name))) for _ in range(5)
            } == {version}, name


def test_an_unknown_version_is_not_found_and_an_ungranted_model_is_refused_by_any_name(
    world: Versions,
) -> None:
    with httpx.Client(timeout=30) as client:
        unknown = post(client, world, world.key, chat(f"{CANARY}@v9"))
        assert unknown.status_code == 404, unknown.text
        assert unknown.json()["error"]["code"] == "model_not_found"
        for name in (CANARY, f"{CANARY}@v1", f"{CANARY}@stable"):
            refused = post(client, world, world.other, chat(name))
            assert refused.status_code == 403, (name, refused.text)
            assert refused.json()["error"]["code"] == "model_not_allowed"


def test_a_pinned_use_case_gets_its_version_whatever_the_split(world: Versions) -> None:
    """The pinned use case's 60 requests all land on stable (v1), where the split would have
    sent three of them to v2."""
    with httpx.Client(timeout=30) as client:
        served = Counter(
            served_version(post(client, world, world.pinned, chat(CANARY))) for _ in range(60)
        )
    assert served == {"v1": 60}


def test_a_sticky_split_keeps_each_use_case_on_one_version(world: Versions) -> None:
    """Twelve use cases on a 50/50 split sticky per use case: each always gets one version,
    and the use cases do not all get the same one."""
    chosen = {}
    with httpx.Client(timeout=30) as client:
        for key in world.sticky:
            served = {served_version(post(client, world, key, chat(STICKY))) for _ in range(8)}
            assert len(served) == 1, served
            chosen[key] = served.pop()
    assert set(chosen.values()) == {"v1", "v2"}, chosen


def test_a_model_rate_limit_counts_every_version(world: Versions) -> None:
    """The model's three requests a minute hold across its versions: the fourth is refused
    whichever version it names."""
    with httpx.Client(timeout=30) as client:
        answers = [
            post(client, world, world.limited, chat(name))
            for name in ("limited", "limited@v1", "limited@v2", "limited@v2")
        ]
    assert [a.status_code for a in answers] == [200, 200, 200, 429], [a.text for a in answers]


def test_the_usage_names_the_version_that_served(world: Versions) -> None:
    with httpx.Client(timeout=30) as client:
        answer = post(client, world, world.key, chat(f"{CANARY}@preview"))
    served_version(answer)
    record_id = answer.headers["x-switchyard-record-id"]
    assert usage_models(world.valkey, record_id) == [f"{CANARY}@v2".encode()]


def test_the_model_list_offers_each_version_and_alias(world: Versions) -> None:
    listed = httpx.get(
        world.url + "/v1/models", headers={"authorization": f"Bearer {world.key}"}, timeout=10
    )
    assert listed.status_code == 200, listed.text
    names = {entry["id"] for entry in listed.json()["data"]}
    assert names == {
        CANARY,
        f"{CANARY}@v1",
        f"{CANARY}@v2",
        f"{CANARY}@stable",
        f"{CANARY}@preview",
        STICKY,
        f"{STICKY}@v1",
        f"{STICKY}@v2",
    }


def test_async_tasks_follow_the_same_routing(world: Versions) -> None:
    """Tasks queued for the model run where the front door would have sent them: the pinned
    use case's on v1, an alias's on its version; the usage names the version."""
    submitted = {}
    with httpx.Client(timeout=30) as client:
        for key, model, version in (
            (world.pinned, CANARY, "v1"),
            (world.key, f"{CANARY}@preview", "v2"),
        ):
            answer = client.post(
                world.url + "/v1/async/chat/completions",
                content=orjson.dumps(chat(model)),
                headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            )
            assert answer.status_code == 202, answer.text
            submitted[answer.json()["id"]] = version
    ended = wait_ended(world.valkey, list(submitted), timeout=60)
    for task, version in zip(ended, submitted.values(), strict=True):
        assert task["status"] == "done", task
        assert task["model"] == f"{CANARY}@{version}", task
        assert task["result"]["model"] == SERVED[version], task


def test_a_task_queued_for_a_version_withdrawn_before_it_runs_is_routed_again() -> None:
    """GIVEN a task queued for chat@v2 and no batcher running WHEN v2 is withdrawn (the
    snapshot republished without it) and a batcher starts THEN the model's routing chooses
    again: v1 serves the task instead of it failing."""
    with module_stack() as stack:
        replicas = {v: stack.simulator(name, "--time-scale", "0") for v, name in SERVED.items()}
        policy = PolicyBuilder().priority_class("prod", rank=0)
        policy.versions(CANARY, {v: [url] for v, url in replicas.items()}, served_names=SERVED)
        key = policy.key(use_case="chatbot", models=[CANARY])
        url = stack.gateway(policy)
        submitted = httpx.post(
            url + "/v1/async/chat/completions",
            content=orjson.dumps(chat(f"{CANARY}@v2")),
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            timeout=30,
        )
        assert submitted.status_code == 202, submitted.text
        assert submitted.headers["x-switchyard-model-version"] == "v2"
        policy.versions(CANARY, {"v1": [replicas["v1"]]}, served_names=SERVED)
        del policy.models[f"{CANARY}@v2"]
        policy.publish(stack.valkey)
        stack.batcher()
        task_id = submitted.json()["id"]
        [ended] = wait_ended(stack.valkey, [task_id], timeout=60)
        assert ended["status"] == "done", ended
        assert ended["model"] == f"{CANARY}@v2", ended  # what it was queued for
        assert ended["result"]["model"] == SERVED["v1"], ended  # what served it
        assert usage_models(stack.valkey, task_id) == [f"{CANARY}@v1".encode()]
