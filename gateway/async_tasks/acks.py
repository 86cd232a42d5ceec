"""An async 202 waits for replicas: ``SWITCHYARD_GATEWAY_USAGE_WAIT_REPLICAS=N`` makes a
submission answer 202 only once N replicas have its tasks (docs/valkey-ha.md, "Async
202s"), so that a failover cannot lose a task a client was told is queued.

Valkey replicates asynchronously; ``WAIT N timeout`` returns how many replicas have the last
write of the connection it is sent on — and blocks that connection meanwhile. submit.lua runs
on the hot path's pipeline, which must never queue behind a WAIT, so the waits go over a
connection of their own, where ack.lua first writes a barrier (replication is in order: a
replica that has it has every task submitted before it) and checks the tasks are on that
server at all (a failover between the submit and the wait must not vouch for tasks the new
primary never got). Submissions waiting at the same time share one ack.lua and one WAIT (a
group commit): one round trip per round, however many submit.

A submission whose replicas do not catch up within ``bound_ms`` gets ``False``: its tasks are
queued on the primary but may not survive a failover (the caller answers 503 with their ids).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from gateway.autopipeline import AutoPipeline
from gateway.scheduling.keys import KEY_PREFIX
from runtime.valkey_urls import VALKEY_FAILURES

logger = logging.getLogger("gateway.async_tasks")

SCRIPT = "async_ack"
BARRIER_TTL_MS = 60_000
MAX_WAIT_MS = 1_000  # one WAIT's longest timeout


@dataclass(slots=True)
class _Waiter:
    task_key: str
    deadline: float  # loop time
    answer: asyncio.Future[bool] = field(repr=False)


class ReplicaAcks:
    """Waits for ``replicas`` replicas to have submitted tasks. One per gateway process, on
    a pipeline of its own (``pipe``: not the hot path's)."""

    def __init__(
        self,
        pipe: AutoPipeline,
        *,
        replicas: int,
        wait_ms: int,
        bound_ms: int,
        prefix: str = KEY_PREFIX,
    ) -> None:
        pipe.register(SCRIPT, (Path(__file__).resolve().parent / "ack.lua").read_text())
        self._pipe = pipe
        self.replicas = replicas
        self._wait_ms = wait_ms
        self._bound_s = bound_ms / 1000
        self._barrier = f"{prefix}atq-ack"
        self._tag = secrets.token_hex(6)
        self._waiting: list[_Waiter] = []
        self._rounds: asyncio.Task[None] | None = None

    async def wait(self, task_key: str) -> bool:
        """True once ``replicas`` replicas have the task (and every write before it); False
        when they did not within the bound, the server lost it, or Valkey failed."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(task_key, loop.time() + self._bound_s, loop.create_future())
        self._waiting.append(waiter)
        if self._rounds is None or self._rounds.done():
            self._rounds = asyncio.create_task(self._run(), name="async-replica-acks")
        return await waiter.answer

    async def close(self) -> None:
        if self._rounds is not None:
            self._rounds.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rounds
        for waiter in self._waiting:
            if not waiter.answer.done():
                waiter.answer.set_result(False)
        self._waiting = []
        await self._pipe.close()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            waiters = [w for w in self._waiting if not w.answer.done()]  # (cancelled callers)
            self._waiting = []
            if not waiters:
                continue
            try:
                missing, acknowledged = await self._round(waiters, loop.time())
            except VALKEY_FAILURES as exc:
                logger.warning("async_replica_wait_failed error=%r", exc)
                for waiter in waiters:
                    _answer(waiter, False)
                continue
            except Exception:
                # A bug, not Valkey: no submission may wait on a round that will never end.
                logger.exception("async_replica_wait_crashed waiters=%s", len(waiters))
                for waiter in waiters:
                    _answer(waiter, False)
                continue
            now = loop.time()
            again = []
            for index, waiter in enumerate(waiters, start=1):
                if index in missing:
                    _answer(waiter, False)
                elif acknowledged >= self.replicas:
                    _answer(waiter, True)
                elif now >= waiter.deadline:
                    _answer(waiter, False)
                else:
                    again.append(waiter)
            # Those still within their bound go first in the next round, with the newcomers.
            self._waiting = again + self._waiting

    async def _round(self, waiters: list[_Waiter], now: float) -> tuple[set[int], int]:
        """ack.lua then WAIT, on the connection of the primary that has the streams' slot;
        the submissions the server does not have, and how many replicas acknowledged."""
        pipe = await self._pipe.node_for(self._barrier.encode())
        remaining_ms = max(1, int((min(w.deadline for w in waiters) - now) * 1000))
        checked = await pipe.send_script(
            SCRIPT,
            [self._barrier, *(w.task_key for w in waiters)],
            [self._tag, BARRIER_TTL_MS],
        )
        # (below the pipeline's 2 s reply timeout, which would take a longer WAIT for a hang)
        timeout_ms = min(self._wait_ms, remaining_ms, MAX_WAIT_MS)
        try:
            acknowledged = await pipe.execute("WAIT", self.replicas, timeout_ms)
        except BaseException:
            checked.cancel()  # (its reply, or the failure, has no one left to read it)
            raise
        missing = {int(index) for index in await checked}
        return missing, int(acknowledged)


def _answer(waiter: _Waiter, value: bool) -> None:
    if not waiter.answer.done():
        waiter.answer.set_result(value)
