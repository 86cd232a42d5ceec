"""Long polls waiting for tasks to end: one pub/sub subscription per gateway process.

The batchers PUBLISH a task's id on ``layout.DONE_CHANNEL`` once its hash says how it ended;
one listener task resolves the futures of whoever waits on that id here. A poll registers
its future first and reads the hash after, so an end published in between is not missed
(the read sees it); a message lost while the subscription reconnects costs that poll only
its early return: it reads the hash again when its wait runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import valkey
import valkey.asyncio as avalkey
from valkey.asyncio.client import PubSub

from gateway.async_tasks import layout
from runtime.valkey_urls import VALKEY_FAILURES

logger = logging.getLogger("gateway.async_tasks")


class DoneWaiters:
    def __init__(self, client: avalkey.Valkey, *, channel: str = layout.DONE_CHANNEL) -> None:
        self._client = client
        self._channel = channel
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}
        self._pubsub: PubSub | None = None
        self._task: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()

    def start(self) -> None:
        """Start the listener (which subscribes, and resubscribes after a failure)."""
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="async-task-waiters")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._drop_subscription()
        for futures in self._waiting.values():
            for future in futures:
                future.cancel()
        self._waiting.clear()

    def register(self, task_id: str) -> asyncio.Future[None]:
        """A future resolved when ``task_id``'s end is published; ``discard`` it after."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(task_id, []).append(future)
        return future

    def discard(self, task_id: str, future: asyncio.Future[None]) -> None:
        futures = self._waiting.get(task_id)
        if futures is None:
            return
        with contextlib.suppress(ValueError):
            futures.remove(future)
        if not futures:
            del self._waiting[task_id]

    def waiting(self) -> int:
        """How many polls wait (for tests and metrics: it returns to 0 when they are done)."""
        return sum(len(futures) for futures in self._waiting.values())

    def _resolve(self, task_id: str) -> None:
        for future in self._waiting.get(task_id, ()):
            if not future.done():
                future.set_result(None)

    async def _listen(self) -> None:
        while True:
            try:
                if self._pubsub is None:
                    pubsub = self._client.pubsub(ignore_subscribe_messages=True)
                    self._pubsub = pubsub
                    await pubsub.subscribe(self._channel)
                    self.subscribed.set()
                message = await self._pubsub.get_message(timeout=1.0)
            except VALKEY_FAILURES as exc:
                logger.warning("async_waiters_listener_error error=%r", exc)
                self.subscribed.clear()
                await self._drop_subscription()
                await asyncio.sleep(0.5)
                continue
            if message is None or message.get("type") != "message":
                continue
            data = message["data"]
            self._resolve(data.decode() if isinstance(data, bytes) else str(data))

    async def _drop_subscription(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(valkey.ValkeyError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # untyped in valkey-py
