"""A task's end told to its ``callback_url``: the batcher enqueues Celery's
``scheduler.deliver_task_webhook`` (scheduler/tasks.py), which signs and POSTs it with
retries. Sent by name through a broker-only Celery app, so that the batcher never imports
Django; the enqueue (a blocking Valkey write in kombu) runs off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from celery import Celery

from runtime.valkey_urls import celery_broker
from scheduler.batcher.payloads import Task

logger = logging.getLogger("scheduler.batcher")

TASK_NAME = "scheduler.deliver_task_webhook"
# The poll view's fields a callback carries (the result body is not one: the receiver polls).
VIEW_FIELDS = (
    "status",
    "model",
    "endpoint",
    "created_ms",
    "deadline_ms",
    "finished_ms",
    "status_code",
    "attempts",
    "collapsed",
    "dead_lettered",
)


def event_data(task: Task, fields: dict[str, str | int]) -> dict[str, Any]:
    """The task's poll view, minus the result body: what the webhook's ``data`` holds."""
    known: dict[str, Any] = {
        "model": task.model,
        "endpoint": task.endpoint,
        "created_ms": task.created_ms,
        "deadline_ms": task.deadline_ms,
        "attempts": task.attempts,
        **fields,
    }
    data: dict[str, Any] = {"id": task.task_id, "object": "task"}
    for name in VIEW_FIELDS:
        if name in known:
            data[name] = known[name]
    if "error" in fields:
        data["error"] = orjson.loads(str(fields["error"]))
    return data


class Callbacks:
    def __init__(self, valkey_url: str) -> None:
        broker, transport_options = celery_broker(valkey_url)
        self._app = Celery("switchyard-batcher", broker=broker, set_as_current=False)
        self._app.conf.broker_transport_options = transport_options
        self._app.conf.task_serializer = "json"
        self._app.conf.accept_content = ["json"]
        self._app.conf.broker_connection_retry_on_startup = True

    def send(self, task: Task, fields: dict[str, str | int]) -> None:
        """Enqueue the delivery, in the loop's executor; a failure is logged, not raised
        (the result is already readable by polling)."""
        status = str(fields.get("status", ""))
        args = [
            int(task.use_case_id) if task.use_case_id.isdigit() else 0,
            task.callback_url,
            f"task.{status}",
            f"msg_{task.task_id}_{status}",  # stable: one event per end, however retried
            event_data(task, fields),
        ]
        asyncio.get_running_loop().run_in_executor(None, self._enqueue, task.task_id, args)

    def _enqueue(self, task_id: str, args: list[Any]) -> None:
        try:
            self._app.send_task(TASK_NAME, args=args)
        except Exception:
            logger.exception("task_webhook_enqueue_failed task=%s", task_id)
