"""Async tasks end to end, as a client sees them: the OpenAI SDK's synchronous calls beside the
async client helper (gateway/async_tasks/client.py, on the SDK's own HTTP client), through a
real gateway process, a real batcher process, real Valkey and the vLLM simulator.

What the parts' own tests prove one side at a time (tests/gateway/test_async_api.py plays the
batcher, tests/scheduler/batcher/test_batcher.py plays the gateway) is proved here joined up: a task
submitted through the gateway is run by the batcher at the async class, its answer is what
the synchronous call answers, identical tasks are collapsed onto one upstream input, usage is
written for the submitting use case, another use case cannot read it, and the submit counted
on the same rate-limit windows the synchronous calls use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import httpx
import pytest
import valkey
from openai import NotFoundError, OpenAI, RateLimitError

from gateway.accounting import USAGE_STREAM
from gateway.async_tasks import layout
from gateway.async_tasks.client import AsyncTaskClient, TaskFailed
from ops.processes import wait_until
from testkit.policy import PolicyBuilder
from testkit.stack import RunningSimulator
from tests.conftest import BatcherFactory, GatewayFactory, SimulatorFactory

EMBED = "embed"
CHAT = "llama"


@dataclass
class Journey:
    sdk: OpenAI
    tasks: AsyncTaskClient
    outsider: AsyncTaskClient
    limited: OpenAI
    embed: RunningSimulator
    client: valkey.Valkey
    use_case_id: int


def _sdk(base_url: str, key: str) -> OpenAI:
    # No retries: the test sees every answer, 429s included.
    return OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture
def journey(
    valkey_client: valkey.Valkey,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
    start_batcher: BatcherFactory,
) -> Journey:
    embed = start_simulator(EMBED, "--kind", "embedding", "--time-scale", "0")
    chat = start_simulator(CHAT, "--time-scale", "0")
    policy = PolicyBuilder()
    policy.model(EMBED, [embed.base_url], capabilities=("embeddings",))
    policy.model(CHAT, [chat.base_url])
    policy.priority_class("prod", rank=0).priority_class("batch", rank=4, max_pool_share=0.5)
    key = policy.key(tenant="acme", use_case="search", priority_class="prod")
    outsider = policy.key(tenant="globex", use_case="ledger", priority_class="prod")
    limited = policy.key(tenant="acme", use_case="tight", priority_class="prod")
    policy.use_case_limits(limited, requests_per_minute=3)
    policy.publish(valkey_client)
    gateway = start_gateway()
    start_batcher()
    sdk = _sdk(gateway.base_url, key)
    return Journey(
        sdk=sdk,
        tasks=AsyncTaskClient(sdk),
        outsider=AsyncTaskClient(_sdk(gateway.base_url, outsider)),
        limited=_sdk(gateway.base_url, limited),
        embed=embed,
        client=valkey_client,
        use_case_id=policy.use_case_id(key),
    )


def _inputs_embedded(sim: RunningSimulator) -> float:
    """Inputs the embedding replica has pooled (one finished sequence each)."""
    text = httpx.get(f"{sim.base_url}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{") and 'finished_reason="stop"' in line
    )


def test_an_async_embedding_answers_what_the_sync_call_answers(journey: Journey) -> None:
    """GIVEN the same text WHEN embedded by the SDK's sync call and by an async task THEN the
    task ends done with the same vector, and a usage record names the use case."""
    text = "The claim was filed on the fourth of March."
    sync = journey.sdk.embeddings.create(model=EMBED, input=text)
    submitted = journey.tasks.submit("embeddings", {"model": EMBED, "input": text})
    assert submitted.status == "queued"
    done = journey.tasks.wait(submitted.id, timeout=30)
    assert done.status == "done"
    assert done.result is not None
    assert done.result["data"][0]["embedding"] == sync.data[0].embedding
    assert done.raw["attempts"] in (0, 1)

    def task_usage() -> list[dict[str, str]]:
        usage = [
            {k.decode(): v.decode() for k, v in fields.items()}
            for _, fields in cast(list[Any], journey.client.xrange(USAGE_STREAM))
        ]
        return [u for u in usage if u["request_id"] == done.id]

    # The batcher's usage, like the gateway's, is buffered and flushed in the background.
    assert wait_until(lambda: len(task_usage()) == 1, timeout=10)
    (record,) = task_usage()
    assert record["use_case_id"] == str(journey.use_case_id)
    assert record["endpoint"] == "/v1/embeddings"
    assert record["status"] == "200"
    assert int(record["prompt_tokens"]) > 0


def test_a_bulk_of_identical_embeddings_goes_upstream_once(journey: Journey) -> None:
    """GIVEN 64 identical embedding bodies submitted in one call WHEN they run THEN every
    task gets the vector and the replica embedded one input, not 64."""
    before = _inputs_embedded(journey.embed)
    body = {"model": EMBED, "input": "same words, sixty-four times"}
    submitted = journey.tasks.submit_many("embeddings", [body] * 64)
    assert len({task.id for task in submitted}) == 64
    ended = [journey.tasks.wait(task.id, timeout=30) for task in submitted]
    vectors = {tuple(task.result["data"][0]["embedding"]) for task in ended if task.result}
    assert len(vectors) == 1
    assert all(task.status == "done" for task in ended)
    assert _inputs_embedded(journey.embed) - before == 1


def test_chat_and_completions_run_as_tasks_at_the_async_class(journey: Journey) -> None:
    """GIVEN a chat task and a completions task WHEN waited for THEN both end done with the
    shape of the synchronous answers."""
    chat = journey.tasks.submit(
        "chat/completions",
        {"model": CHAT, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8},
    )
    completion = journey.tasks.submit(
        "completions", {"model": CHAT, "prompt": "Once upon", "max_tokens": 8}
    )
    chat_done = journey.tasks.wait(chat.id, timeout=30)
    completion_done = journey.tasks.wait(completion.id, timeout=30)
    assert chat_done.result is not None
    assert completion_done.result is not None
    assert chat_done.result["choices"][0]["message"]["role"] == "assistant"
    assert completion_done.result["choices"][0]["text"]
    assert cast(bytes, journey.client.hget(layout.task(chat.id), "status")) == b"done"


def test_only_the_owner_reads_a_task(journey: Journey) -> None:
    """GIVEN a task of acme's use case WHEN another tenant's key asks for it THEN it is a 404,
    as for a task that never was."""
    task = journey.tasks.submit("embeddings", {"model": EMBED, "input": "private"})
    journey.tasks.wait(task.id, timeout=30)
    with pytest.raises(NotFoundError):
        journey.outsider.get(task.id)
    with pytest.raises(NotFoundError):
        journey.outsider.get("task_" + "0" * 24)


def test_async_submits_and_sync_calls_share_the_rate_limit(journey: Journey) -> None:
    """GIVEN a use case allowed 3 requests a minute WHEN it submits 2 tasks in one call and
    makes 1 sync call THEN its next call, sync or async, is a 429."""
    tasks = AsyncTaskClient(journey.limited)
    body = {"model": EMBED, "input": "counted"}
    tasks.submit_many("embeddings", [body, body])
    journey.limited.embeddings.create(model=EMBED, input="counted")
    with pytest.raises(RateLimitError):
        journey.limited.embeddings.create(model=EMBED, input="over")
    with pytest.raises(RateLimitError):
        tasks.submit("embeddings", body)


def test_a_task_that_fails_raises_with_its_error(journey: Journey) -> None:
    """GIVEN a chat task the replica refuses (a prompt over the model's context) WHEN waited
    for THEN the helper raises TaskFailed carrying the upstream's error object."""
    huge = "word " * 200_000
    task = journey.tasks.submit(
        "chat/completions", {"model": CHAT, "messages": [{"role": "user", "content": huge}]}
    )
    with pytest.raises(TaskFailed) as failed:
        journey.tasks.wait(task.id, timeout=30)
    assert failed.value.task.status == "failed"
    assert failed.value.task.error is not None
    assert failed.value.task.error.get("message")
