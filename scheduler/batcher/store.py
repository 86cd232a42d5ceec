"""The batcher's side of the task contract in Valkey (gateway/async_tasks/layout.py): reading
the partition streams, marking tasks running, ending them, counting failed attempts.

Every write that ends a task is one Lua call (finish.lua) so that its result, its stream
entry and the model's depth never disagree; a batch's calls go in one pipeline.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import valkey
import valkey.asyncio as avalkey
from valkey.asyncio import cluster as acluster

from gateway.async_tasks import layout
from runtime.valkey_urls import async_transaction
from scheduler.batcher.payloads import Task

_HERE = Path(__file__).resolve().parent
# The drain rate's EWMA time constant: about the last five seconds count.
DRAIN_TAU_MS = 5_000


def consumer_name() -> str:
    """This process's name in the consumer groups: "<host>-<pid>"."""
    return f"{socket.gethostname()}-{os.getpid()}"


def error_object(
    message: str, *, type: str = "api_error", code: str | None = None
) -> dict[str, Any]:
    """An OpenAI error object (what a task's ``error`` field holds, as JSON)."""
    return {"message": message, "type": type, "param": None, "code": code}


@dataclass(slots=True)
class Ending:
    """How one task ends: its terminal fields; ``dead_letter`` to copy its entry to the DLQ."""

    task: Task
    fields: dict[str, str | int]
    dead_letter: dict[str, str] | None = None


def _b(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class TaskStore:
    def __init__(self, client: avalkey.Valkey, *, consumer: str | None = None) -> None:
        self.client = client
        self.consumer = consumer or consumer_name()
        self._start = client.register_script((_HERE / "start.lua").read_text())
        self._finish = client.register_script((_HERE / "finish.lua").read_text())
        self._attempt = client.register_script((_HERE / "attempt.lua").read_text())
        self._drain = client.register_script((_HERE / "drain.lua").read_text())
        self._groups: set[str] = set()

    # --- discovery and reading ----------------------------------------------------------
    async def streams(self) -> list[tuple[str, str]]:
        """(model, stream key) for every partition of every registered model."""
        registry = await self.client.hgetall(layout.partitions_registry())  # type: ignore[misc]
        found: list[tuple[str, str]] = []
        for raw_model, raw_count in registry.items():
            model = _b(raw_model)
            try:
                count = int(raw_count)
            except ValueError:
                continue
            found += [(model, layout.stream(model, p)) for p in range(max(count, 0))]
        return found

    async def ensure_group(self, stream: str) -> None:
        """XGROUP CREATE … MKSTREAM, once per stream; an existing group is fine."""
        if stream in self._groups:
            return
        try:
            await self.client.xgroup_create(stream, layout.GROUP, id="0", mkstream=True)
        except valkey.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._groups.add(stream)

    async def read(
        self, streams: list[str], *, count: int, block_ms: int
    ) -> list[tuple[str, str, dict[bytes, bytes]]]:
        """New entries for this consumer: (stream, entry id, fields)."""
        if not streams or count <= 0:
            return []
        reply = await self.client.xreadgroup(
            layout.GROUP,
            self.consumer,
            dict.fromkeys(streams, ">"),
            count=count,
            block=block_ms,
        )
        out: list[tuple[str, str, dict[bytes, bytes]]] = []
        for stream, entries in reply or []:
            for entry_id, fields in entries:
                if fields:  # an entry deleted while pending reads as empty
                    out.append((_b(stream), _b(entry_id), fields))
        return out

    async def reclaim(
        self, stream: str, *, min_idle_ms: int, count: int = 100
    ) -> list[tuple[str, dict[bytes, bytes]]]:
        """Entries idle in a (dead) consumer's pending list past ``min_idle_ms``, now ours.
        Entries deleted meanwhile are acknowledged (nothing to run)."""
        reply = await self.client.xautoclaim(
            stream, layout.GROUP, self.consumer, min_idle_time=min_idle_ms, count=count
        )
        claimed = reply[1] if len(reply) > 1 else []
        deleted = reply[2] if len(reply) > 2 else []
        if deleted:
            await self.client.xack(stream, layout.GROUP, *deleted)
        return [(_b(entry_id), fields) for entry_id, fields in claimed if fields]

    async def forget_consumers(self, stream: str, *, idle_ms: int) -> int:
        """Delete the group's consumers idle past ``idle_ms`` with nothing pending (never this
        one); returns how many."""
        forgotten = 0
        for consumer in await self.client.xinfo_consumers(stream, layout.GROUP):
            name = _b(consumer["name"])
            if name != self.consumer and consumer["pending"] == 0 and consumer["idle"] > idle_ms:
                await self.client.xgroup_delconsumer(stream, layout.GROUP, name)
                forgotten += 1
        return forgotten

    async def touch(self, held: dict[str, list[str]]) -> None:
        """Reset the idle time of entries this batcher still holds (buffered, running or
        waiting to retry), so that no other batcher reclaims live work."""
        if not held:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for stream, ids in held.items():
                pipe.xclaim(stream, layout.GROUP, self.consumer, 0, list[Any](ids), justid=True)
            await pipe.execute()

    # --- a batch's life -------------------------------------------------------------------
    async def start(self, tasks: list[Task], now_ms: int) -> list[tuple[str, int]]:
        """Mark ``tasks`` running; per task its status before and its attempts so far."""
        reply = await self._start(keys=[layout.task(t.task_id) for t in tasks], args=[now_ms])
        values = [_b(v) for v in reply]
        return [(values[i], int(values[i + 1] or 0)) for i in range(0, len(values), 2)]

    async def attempt_failed(self, task: Task, error: dict[str, Any]) -> int:
        """Count a failed attempt; the attempts now (-1: the task is gone or has ended)."""
        return int(
            await self._attempt(keys=[layout.task(task.task_id)], args=[orjson.dumps(error)])
        )

    async def end(self, endings: list[Ending]) -> list[bool]:
        """End tasks (finish.lua each, one pipeline); per ending whether it ended the task."""
        if not endings:
            return []
        async with await self._ending_pipeline() as pipe:
            for ending in endings:
                task = ending.task
                letter: list[str | int] = []
                for name, text in (ending.dead_letter or {}).items():
                    letter += [name, text]
                pairs: list[str | int] = []
                for field, value in ending.fields.items():
                    pairs += [field, value]
                await self._finish(
                    keys=[
                        layout.task(task.task_id),
                        task.stream,
                        layout.depth(task.model),
                        layout.dead_letters(),
                    ],
                    args=[
                        task.entry_id,
                        layout.GROUP,
                        task.task_id,
                        layout.DONE_CHANNEL,
                        len(letter),
                        *letter,
                        *pairs,
                    ],
                    client=pipe,
                )
            replies = await pipe.execute()
        return [bool(int(reply[0])) for reply in replies]

    async def _ending_pipeline(self) -> avalkey.client.Pipeline:
        """One server or Sentinel: a plain pipeline. A Cluster: valkey-py's cluster pipeline
        refuses scripts, and every key finish.lua is given is in the streams' slot, so the
        calls go in one MULTI on that slot's primary (async_transaction)."""
        if isinstance(self.client, acluster.ValkeyCluster):
            return await async_transaction(self.client, layout.dead_letters())
        return self.client.pipeline(transaction=False)

    async def drained(self, model: str, ended: int, now_ms: int) -> None:
        await self._drain(keys=[layout.drain_rate(model)], args=[now_ms, ended, DRAIN_TAU_MS])

    # --- the result cache ---------------------------------------------------------------
    async def cached(self, keys: list[str]) -> list[bytes | None]:
        if not keys:
            return []
        return list(await self.client.mget(keys))

    async def cache(self, items: list[tuple[str, bytes, int]]) -> None:
        """(key, result body, seconds) each."""
        if not items:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for key, body, seconds in items:
                pipe.set(key, body, ex=seconds)
            await pipe.execute()
