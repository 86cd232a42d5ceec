"""The batcher's Valkey scripts (scheduler/batcher/*.lua) and dead-letter functions, straight
against a real server: a task ends once, its entry and depth are counted once, a replay
queues a letter once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, cast

import valkey
import valkey.asyncio as avalkey

from gateway.async_tasks import layout
from scheduler.batcher.payloads import Task, parse_entry
from scheduler.batcher.store import Ending, TaskStore
from testkit.async_tasks import depth, now_ms, submit, view


def read_one(client: valkey.Valkey, model: str = "embed") -> Task:
    """The model's one entry, as the batcher parses it (read through the group)."""
    for p in range(2):
        stream = layout.stream(model, p)
        with contextlib.suppress(valkey.ResponseError):
            client.xgroup_create(stream, layout.GROUP, id="0", mkstream=True)
        reply = cast(list[Any], client.xreadgroup(layout.GROUP, "t", {stream: ">"}, count=1))
        if reply and reply[0][1]:
            entry_id, fields = reply[0][1][0]
            return parse_entry(stream, entry_id.decode(), fields)
    raise AssertionError("no entry")


def run(valkey_url: str, work: Any) -> Any:
    async def go() -> Any:
        client = avalkey.Valkey.from_url(valkey_url)
        try:
            return await work(TaskStore(client, consumer="t"))
        finally:
            await client.aclose()

    return asyncio.run(go())


def done(task: Task, text: str) -> Ending:
    return Ending(task, {"status": "done", "result": text, "status_code": 200, "finished_ms": 1})


def test_a_task_ends_once_and_its_entry_counts_down_the_depth_once(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    task_id = submit(
        valkey_client, model="embed", endpoint="/v1/embeddings", body={"input": "x"},
        use_case_id=1, result_ttl_s=90,
    )  # fmt: skip
    task = read_one(valkey_client)
    first = run(valkey_url, lambda store: store.end([done(task, '{"n":1}')]))
    second = run(valkey_url, lambda store: store.end([done(task, '{"n":2}')]))
    assert (first, second) == ([True], [False])
    assert view(valkey_client, task_id)["result"] == {"n": 1}
    assert depth(valkey_client, "embed") == 0
    assert valkey_client.xlen(task.stream) == 0
    ttl = cast(int, valkey_client.pttl(layout.task(task_id)))
    assert 80_000 < ttl <= 90_000  # the task's own result lifetime
    assert valkey_client.xpending(task.stream, layout.GROUP)["pending"] == 0  # type: ignore[index]


def test_a_gone_task_is_acknowledged_without_being_made_again(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    task_id = submit(
        valkey_client, model="embed", endpoint="/v1/embeddings", body={"input": "x"},
        use_case_id=1,
    )  # fmt: skip
    task = read_one(valkey_client)
    valkey_client.delete(layout.task(task_id))
    assert run(valkey_url, lambda store: store.start([task], now_ms())) == [("gone", 0)]
    assert run(valkey_url, lambda store: store.end([done(task, "{}")])) == [False]
    assert valkey_client.exists(layout.task(task_id)) == 0
    assert depth(valkey_client, "embed") == 0
    assert run(valkey_url, lambda store: store.attempt_failed(task, {"message": "x"})) == -1


def test_failed_attempts_count_up_and_show_the_task_queued(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    task_id = submit(
        valkey_client, model="embed", endpoint="/v1/embeddings", body={"input": "x"},
        use_case_id=1,
    )  # fmt: skip
    task = read_one(valkey_client)
    assert run(valkey_url, lambda store: store.start([task], now_ms())) == [("queued", 0)]
    assert view(valkey_client, task_id)["status"] == "running"
    # Found running again: the attempt that started it never ended, and counts as failed.
    assert run(valkey_url, lambda store: store.start([task], now_ms())) == [("running", 1)]
    error = {"message": "boom", "type": "api_error", "param": None, "code": None}
    assert run(valkey_url, lambda store: store.attempt_failed(task, error)) == 2
    shown = view(valkey_client, task_id)
    assert shown["status"] == "queued"
    assert shown["error"] == error
    # Tried again after a failure it was told of: nothing more to count.
    assert run(valkey_url, lambda store: store.start([task], now_ms())) == [("queued", 2)]


def test_consumers_long_idle_with_nothing_pending_are_forgotten(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    """GIVEN a group with a consumer that holds an entry, one that holds none, and this
    batcher WHEN consumers idle past the bound are forgotten THEN only the empty one goes."""
    submit(
        valkey_client, model="embed", endpoint="/v1/embeddings", body={"input": "x"},
        use_case_id=1, partitions=1,
    )  # fmt: skip
    stream = layout.stream("embed", 0)
    valkey_client.xgroup_create(stream, layout.GROUP, id="0")
    valkey_client.xreadgroup(layout.GROUP, "holder", {stream: ">"}, count=1)
    valkey_client.xreadgroup(layout.GROUP, "empty", {stream: ">"}, count=1)
    valkey_client.xreadgroup(layout.GROUP, "t", {stream: ">"}, count=1)
    time.sleep(0.02)
    assert run(valkey_url, lambda store: store.forget_consumers(stream, idle_ms=5)) == 1
    left = cast(list[Any], valkey_client.xinfo_consumers(stream, layout.GROUP))
    assert sorted(c["name"].decode() for c in left) == ["holder", "t"]
