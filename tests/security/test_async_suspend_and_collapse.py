"""Async tasks answer to their use case's governance when they run, not only when they were
submitted, and never share a computation across use cases (issue 24, defect 13).

Real processes: Valkey, the vLLM simulator (an embedding model), a gateway and a batcher. The
tasks are submitted through the gateway while no batcher runs, so that they wait in the
streams and are read into one batch once the batcher starts.

Personas: acme's ``search`` use case (alice's key) and globex's ``ledger`` use case (gary's
key), each with its own tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import valkey

from gateway.accounting import USAGE_STREAM
from ops.processes import wait_until
from testkit.async_tasks import view, wait_ended
from testkit.policy import PolicyBuilder
from testkit.stack import RunningGateway, RunningSimulator
from tests.conftest import BatcherFactory, GatewayFactory, SimulatorFactory

EMBED = "embed-governed"
# One read, one batch: a window long enough that every queued task is in the first flush.
ONE_BATCH = {
    "SWITCHYARD_BATCHER_WINDOW_MS": "300",
    "SWITCHYARD_BATCHER_MIN_WINDOW_MS": "300",
    "SWITCHYARD_BATCHER_MAX_WINDOW_MS": "300",
}


@dataclass
class World:
    gateway: RunningGateway
    embed: RunningSimulator
    valkey: valkey.Valkey
    policy: PolicyBuilder
    alice: str
    gary: str

    def submit(self, key: str, text: str) -> str:
        answer = httpx.post(
            self.gateway.base_url + "/v1/async/embeddings",
            json={"model": EMBED, "input": text},
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert answer.status_code == 202, answer.text
        task_id: str = answer.json()["id"]
        return task_id

    def usage(self, task_id: str) -> dict[str, str]:
        def found() -> list[dict[str, str]]:
            return [
                {k.decode(): v.decode() for k, v in fields.items()}
                for _, fields in self.valkey.xrange(USAGE_STREAM)
                if fields[b"request_id"] == task_id.encode()
            ]

        assert wait_until(lambda: bool(found()), timeout=15), f"no usage entry for {task_id}"
        [entry] = found()
        return entry


def embedded_inputs(sim: RunningSimulator) -> float:
    """Inputs the embedding replica has pooled (one finished sequence each)."""
    text = httpx.get(f"{sim.base_url}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{") and 'finished_reason="stop"' in line
    )


@pytest.fixture
def world(
    valkey_client: valkey.Valkey, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> World:
    embed = start_simulator(EMBED, "--kind", "embedding", "--time-scale", "0")
    policy = PolicyBuilder()
    policy.model(EMBED, [embed.base_url], capabilities=("embeddings",))
    policy.priority_class("prod", rank=0).priority_class("batch", rank=4)
    alice = policy.key(tenant="acme", use_case="search", priority_class="prod")
    gary = policy.key(tenant="globex", use_case="ledger", priority_class="prod")
    # Approved use cases have their entry in the snapshot, as governance publishes them.
    policy.use_case_limits(alice).use_case_limits(gary)
    policy.publish(valkey_client)
    return World(start_gateway(), embed, valkey_client, policy, alice, gary)


def suspend(world: World, key: str) -> None:
    """What governance publishes once an officer suspends the key's use case: the use case,
    its keys and its clients are left out of the snapshot (governance/snapshot.py)."""
    use_case_id = world.policy.use_case_id(key)
    world.policy.revoke(key)
    del world.policy.use_cases[str(use_case_id)]
    world.policy.publish(world.valkey)


def test_tasks_of_a_use_case_suspended_after_submit_are_not_run(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN alice's and gary's tasks queued WHEN an officer suspends alice's use case before
    a batcher reads them THEN alice's end failed with a 403 naming the use case's status and
    never reach the replica, and gary's, in the same batch, run."""
    suspended = [world.submit(world.alice, f"quarterly report {i}") for i in range(3)]
    running = [world.submit(world.gary, f"ledger line {i}") for i in range(2)]
    suspend(world, world.alice)
    before = embedded_inputs(world.embed)
    start_batcher(**ONE_BATCH)

    ended = wait_ended(world.valkey, suspended + running, timeout=30)
    for task in ended[: len(suspended)]:
        assert task["status"] == "failed", task
        assert task["status_code"] == "403"
        assert task["error"]["type"] == "permission_error"
        assert task["error"]["code"] == "use_case_not_approved"
        assert "result" not in task
    assert [task["status"] for task in ended[len(suspended) :]] == ["done", "done"]
    # Only gary's inputs were embedded.
    assert embedded_inputs(world.embed) - before == len(running)


def test_identical_tasks_of_two_tenants_are_not_collapsed(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN alice and gary submit the same embedding WHEN one batch runs both THEN each is
    computed for its own use case: neither says collapsed, the replica embeds it twice, and
    each usage entry carries its own tenant, use case and tokens."""
    text = "the same words, two tenants"
    mine, theirs = world.submit(world.alice, text), world.submit(world.gary, text)
    before = embedded_inputs(world.embed)
    start_batcher(**ONE_BATCH)

    ended = wait_ended(world.valkey, [mine, theirs], timeout=30)
    assert [task["status"] for task in ended] == ["done", "done"]
    assert [task.get("collapsed") for task in ended] == [None, None]
    assert embedded_inputs(world.embed) - before == 2
    for task_id, key, tenant in ((mine, world.alice, "acme"), (theirs, world.gary, "globex")):
        usage = world.usage(task_id)
        assert usage["tenant"] == tenant
        assert usage["use_case_id"] == str(world.policy.use_case_id(key))
        assert int(usage["prompt_tokens"]) > 0


def test_identical_tasks_of_one_use_case_collapse_and_each_is_billed(
    world: World, start_batcher: BatcherFactory
) -> None:
    """GIVEN alice submits the same embedding three times WHEN one batch runs them THEN the
    replica embeds it once, each task says collapsed, and each task's usage carries the
    tokens of the answer it got (a copy is not free to the use case that asked for it)."""
    text = "the same words, one use case"
    ids = [world.submit(world.alice, text) for _ in range(3)]
    before = embedded_inputs(world.embed)
    start_batcher(**ONE_BATCH)

    ended: list[dict[str, Any]] = wait_ended(world.valkey, ids, timeout=30)
    assert {task["status"] for task in ended} == {"done"}
    assert [task.get("collapsed") for task in ended] == ["1", "1", "1"]
    assert embedded_inputs(world.embed) - before == 1
    tokens = {ended[0]["result"]["usage"]["prompt_tokens"]}
    for task_id in ids:
        usage = world.usage(task_id)
        assert usage["tenant"] == "acme"
        assert usage["use_case_id"] == str(world.policy.use_case_id(world.alice))
        assert {int(usage["prompt_tokens"])} == tokens
    assert view(world.valkey, ids[0])["result"] == ended[1]["result"]
