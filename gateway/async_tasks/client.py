"""A small client for Switchyard's async task API, on the OpenAI SDK's own HTTP client.

The OpenAI SDK has no async-task calls, but its client sends any request with its key, base
URL, timeouts and retries (429 and 5xx with ``Retry-After``, the async API's backpressure, are
retried by the SDK itself). This module needs only ``openai`` and the standard library: copy it
into a project, or import it from here::

    from openai import OpenAI
    from gateway.async_tasks.client import AsyncTaskClient

    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="sk-...")
    tasks = AsyncTaskClient(client)
    task = tasks.submit("embeddings", {"model": "embed", "input": "hello"})
    done = tasks.wait(task.id)            # long-polls GET /v1/tasks/{id}?wait=...
    vector = done.result["data"][0]["embedding"]

See docs/async.md for the statuses, the errors and how long a result is kept.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, cast

from openai import OpenAI

Endpoint = Literal["embeddings", "completions", "chat/completions"]
TERMINAL = frozenset({"done", "failed", "expired"})
_LONGEST_WAIT_S = 30.0  # one long poll; the gateway accepts up to 60


class TaskFailed(Exception):
    """The task ended failed or expired; ``task.error`` is the OpenAI-style error object."""

    def __init__(self, task: Task) -> None:
        message = (task.error or {}).get("message", task.status)
        super().__init__(f"Task {task.id} {task.status}: {message}")
        self.task = task


class TaskTimeout(TimeoutError):
    """``wait`` gave up before the task ended; the task itself goes on."""


@dataclass(frozen=True)
class Task:
    """A task as ``GET /v1/tasks/{id}`` shows it; ``raw`` is the whole document."""

    id: str
    status: str
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> Task:
        return cls(
            id=str(document["id"]),
            status=str(document["status"]),
            result=document.get("result"),
            error=document.get("error"),
            raw=document,
        )

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL


class AsyncTaskClient:
    """Submit tasks and wait for them through an ``openai.OpenAI`` client."""

    def __init__(self, client: OpenAI) -> None:
        self._client = client

    def submit(
        self,
        endpoint: Endpoint,
        body: Mapping[str, Any],
        *,
        deadline: datetime | float | None = None,
        callback_url: str | None = None,
    ) -> Task:
        """Queue one request (the body of the synchronous call) → its task, status queued."""
        document = dict(body)
        if deadline is not None:
            document["deadline"] = (
                deadline.timestamp() if isinstance(deadline, datetime) else deadline
            )
        if callback_url is not None:
            document["callback_url"] = callback_url
        reply = self._client.post(f"/async/{endpoint}", body=document, cast_to=object)
        return Task.from_json(cast(Mapping[str, Any], reply))

    def submit_many(self, endpoint: Endpoint, bodies: Sequence[Mapping[str, Any]]) -> list[Task]:
        """Queue several requests in one call (all or none) → their tasks, in order."""
        reply = self._client.post(f"/async/{endpoint}", body=list(bodies), cast_to=object)
        return [Task.from_json(item) for item in cast(Mapping[str, Any], reply)["data"]]

    def get(self, task_id: str, *, wait: float = 0) -> Task:
        """The task now; with ``wait``, as soon as it ends or after that many seconds."""
        if wait:
            # The request outlives the wait: the client's own timeout may be shorter.
            reply = self._client.get(
                f"/tasks/{task_id}",
                cast_to=object,
                options={"params": {"wait": wait}, "timeout": wait + 10.0},
            )
        else:
            reply = self._client.get(f"/tasks/{task_id}", cast_to=object)
        return Task.from_json(cast(Mapping[str, Any], reply))

    def wait(self, task_id: str, *, timeout: float = 600.0, raise_on_failure: bool = True) -> Task:
        """Long-poll until the task ends; TaskFailed if it failed or expired (unless told
        not to), TaskTimeout after ``timeout`` seconds."""
        give_up = time.monotonic() + timeout
        while True:
            left = give_up - time.monotonic()
            task = self.get(task_id, wait=max(0.0, min(_LONGEST_WAIT_S, left)))
            if task.ended:
                if raise_on_failure and task.status != "done":
                    raise TaskFailed(task)
                return task
            if time.monotonic() >= give_up:
                raise TaskTimeout(f"Task {task_id} is still {task.status} after {timeout} s.")
