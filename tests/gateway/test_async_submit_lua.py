"""submit.lua through TaskQueue, against the session's real valkey-server: a submit is all or
nothing, across the models of one bulk call and across its rate limits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import valkey
import valkey.asyncio as avalkey

from gateway.admission.limits import Limit, limit_args
from gateway.async_tasks import layout
from gateway.async_tasks.queue import (
    BacklogFull,
    LimitPlan,
    NewTask,
    TaskQueue,
    backlog_retry_after_s,
    merged_limits,
)
from gateway.autopipeline import AutoPipeline, pack_values
from gateway.scheduling import RateLimited, keys
from testkit.reply_loss import ReplyLosingProxy

NOW = 1_767_225_600_000


def _run(valkey_url: str, body: Callable[[TaskQueue], Awaitable[None]], **settings: Any) -> None:
    async def main() -> None:
        client = avalkey.Valkey.from_url(valkey_url)
        pipe = AutoPipeline(client)
        queue = TaskQueue(
            pipe,
            clock=lambda: NOW,
            max_backlog=settings.get("max_backlog", 100),
            queue_ttl_s=60,
            partitions=2,
            backlog_retry_after_s=30,
        )
        try:
            await body(queue)
        finally:
            await pipe.close()
            await client.aclose()

    asyncio.run(asyncio.wait_for(main(), 20))


def _task(model: str) -> NewTask:
    return NewTask(
        model, "/v1/embeddings", 10, 0, "", b'{"model":"%s","input":"x"}' % model.encode()
    )


def _submit(queue: TaskQueue, tasks: list[NewTask], limits: list[Limit]) -> Awaitable[Any]:
    return queue.submit(
        tasks, limits, use_case_id=7, tenant="acme", priority_class="batch", result_ttl_s=60
    )


def _written(client: valkey.Valkey) -> list[bytes]:
    keys: list[bytes] = client.keys("sy:{sy}:*")  # type: ignore[assignment]
    return sorted(keys)


def test_a_full_backlog_of_one_model_queues_nothing_for_the_others(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    """GIVEN model b is at its bound WHEN one call submits a task of a and one of b THEN
    BacklogFull for b, and a's task, depth and registry entry are not written either."""
    valkey_client.set(layout.depth("b"), 100)
    before = _written(valkey_client)

    async def body(queue: TaskQueue) -> None:
        with pytest.raises(BacklogFull) as refused:
            await _submit(queue, [_task("a"), _task("b")], [])
        assert refused.value.model == "b"
        assert refused.value.retry_after_s == 30

    _run(valkey_url, body)
    assert _written(valkey_client) == before


def test_a_refused_limit_counts_nothing_and_an_accepted_call_counts_every_task(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    """GIVEN a 3-request window WHEN a call of 2 passes and a call of 2 more would not THEN
    the window holds 2, the second call is RateLimited and wrote nothing."""
    limit = Limit("uc:7:rpm", "req", 60_000, 3, 1, "use case x requests per minute")

    async def body(queue: TaskQueue) -> None:
        two = merged_limits([[limit], [limit]])
        assert [merged.cost for merged in two] == [2]
        queued = await _submit(queue, [_task("a"), _task("a")], two)
        assert len(queued) == 2
        written = _written(valkey_client)
        with pytest.raises(RateLimited) as refused:
            await _submit(queue, [_task("a"), _task("a")], two)
        assert refused.value.limit.name == "use case x requests per minute"
        assert _written(valkey_client) == written

    _run(valkey_url, body)
    window = f"sy:{{sy}}:rl:uc:7:rpm:{NOW // 60_000}"
    assert valkey_client.get(window) == b"2"
    assert valkey_client.get(layout.depth("a")) == b"2"


def test_the_backlog_retry_after_follows_a_fresh_drain_rate_only() -> None:
    assert (
        backlog_retry_after_s(excess=10, rate=b"4", at_ms=b"1000", now_ms=2000, fallback_s=30) == 3
    )
    assert (
        backlog_retry_after_s(excess=10, rate=b"4", at_ms=b"1000", now_ms=70_000, fallback_s=30)
        == 30
    )
    assert (
        backlog_retry_after_s(excess=10, rate=b"0", at_ms=b"1000", now_ms=2000, fallback_s=30) == 30
    )
    assert backlog_retry_after_s(excess=10, rate=b"", at_ms=b"", now_ms=2000, fallback_s=30) == 30
    assert (
        backlog_retry_after_s(
            excess=10**9, rate=b"0.001", at_ms=b"1000", now_ms=2000, fallback_s=30
        )
        == 3600
    )


def test_a_limit_plans_packed_limits_are_the_charged_limits_packed() -> None:
    """The pre-packed form the single-submit path sends is byte for byte what packing the
    charged limits gives (submit.lua reads them as limits.lua's five values each)."""
    limits = [
        Limit("global:rpm", "req", 60_000, 1000, 1, "global requests per minute"),
        Limit("uc:7:tpm", "tok", 60_000, 10**6, 0, "use case x tokens per minute"),
        Limit("uc:7:rpm", "req", 60_000, 50, 1, "use case x requests per minute"),
        Limit("uc:7:tpd", "tok", 86_400_000, 10**9, 0, "use case x tokens per day"),
    ]
    plan = LimitPlan(limits)
    for tokens in (1, 37, 123_456):
        assert plan.packed(tokens) == pack_values(limit_args(plan.charged(tokens)))
    assert LimitPlan([]).packed(5) == b""


@pytest.mark.parametrize(
    ("ran", "then_down"),
    [(True, False), (False, False), (False, True)],
    ids=["queued-reply-lost", "never-ran", "never-ran-node-gone"],
)
def test_a_split_submit_whose_connection_dies_counts_exactly_when_its_task_was_queued(
    valkey_client: valkey.Valkey, ran: bool, then_down: bool
) -> None:
    """GIVEN split slots (a Cluster's way: the use case's limit is charged on the tenant's
    slot by account.lua, then submit.lua queues on the streams' slot) WHEN the connection dies
    right after submit.lua ran (its reply lost) THEN the caller gets the connection error and
    the charge stands, settled: the task is queued and will run. WHEN it dies before submit.lua
    could run THEN the charge is given back. Either way no refund record is left. WHEN the
    node stays unreachable, so that nobody can tell THEN the charge stays counted (its refund
    record with it): over-counting is the bounded error, never a queued task uncounted."""
    tenant_slot = keys.account_prefix("acme")
    limit = Limit("uc:7:rpm", "req", 60_000, 10, 1, "use case x requests per minute", tenant_slot)
    window = f"{limit.stem}:{NOW // 60_000}"
    port = valkey_client.connection_pool.connection_kwargs["port"]

    async def main() -> None:
        proxy = ReplyLosingProxy(port)
        client = avalkey.Valkey(port=await proxy.start())
        pipe = AutoPipeline(client)
        queue = TaskQueue(
            pipe,
            clock=lambda: NOW,
            max_backlog=100,
            queue_ttl_s=60,
            partitions=2,
            backlog_retry_after_s=30,
            split_slots=True,
        )
        try:
            # One that goes through: the scripts are loaded, so the armed write is the call.
            await _submit(queue, [_task("a")], [limit])
            # Only submit.lua's call names a task's key (account.lua's charge does not).
            marker = layout.task("", prefix=keys.KEY_PREFIX).encode()
            proxy.arm(marker, ran=ran, then_down=then_down)
            with pytest.raises(valkey.ConnectionError):
                await _submit(queue, [_task("a")], [limit])
            assert proxy.lost.is_set()
        finally:
            await pipe.close()
            await client.aclose()
            await proxy.close()

    asyncio.run(asyncio.wait_for(main(), 20))
    assert valkey_client.get(layout.depth("a")) == (b"2" if ran else b"1")
    assert valkey_client.get(window) == (b"2" if ran or then_down else b"1")
    refund_records: list[bytes] = valkey_client.keys(tenant_slot + "rf:*")  # type: ignore[assignment]
    assert len(refund_records) == (1 if then_down else 0)
