"""What a client reads about a task: the task hash (layout.TASK_FIELDS) as the API's JSON.

Times are epoch seconds with millisecond precision (null until they happen); ``result`` is
the upstream's JSON response, ``error`` an OpenAI error object, each present once the task
ended with one. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.async_tasks import layout
from gateway.async_tasks.queue import QueuedTask

OBJECT = "async.task"


def fields_of(reply: Any) -> dict[str, bytes]:
    """HGETALL's reply (a flat list in RESP2, a map in RESP3) as a dict of str → bytes."""
    if isinstance(reply, dict):
        return {_text(k): v for k, v in reply.items()}
    return {_text(reply[i]): reply[i + 1] for i in range(0, len(reply), 2)}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _seconds(value: bytes | None) -> float | None:
    if not value:
        return None
    milliseconds = int(value)
    return milliseconds / 1000 if milliseconds else None


def _json(value: bytes | None) -> Any:
    if not value:
        return None
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return None


def status_of(fields: Mapping[str, bytes]) -> str:
    return fields.get("status", b"").decode()


def is_terminal(fields: Mapping[str, bytes]) -> bool:
    return status_of(fields) in layout.TERMINAL


def task_document(task_id: str, fields: Mapping[str, bytes]) -> dict[str, Any]:
    """The poll's body. ``expires_at``: when the task goes away — its queue TTL while it
    waits or runs, the use case's result TTL after it ended."""
    status = status_of(fields)
    finished = _seconds(fields.get("finished_ms"))
    expires = _seconds(fields.get("expires_ms"))
    if status in layout.TERMINAL and finished is not None:
        expires = finished + int(fields.get("result_ttl_s") or 0)
    error = _json(fields.get("error"))
    if status == "expired" and error is None:
        error = {
            "message": "The task passed its deadline or queue TTL before it could run.",
            "type": "timeout_error",
            "param": None,
            "code": "task_expired",
        }
    return {
        "id": task_id,
        "object": OBJECT,
        "status": status,
        "model": fields.get("model", b"").decode(),
        "endpoint": fields.get("endpoint", b"").decode(),
        "created_at": _seconds(fields.get("created_ms")),
        "started_at": _seconds(fields.get("started_ms")),
        "finished_at": finished,
        "deadline": _seconds(fields.get("deadline_ms")),
        "attempts": int(fields.get("attempts") or 0),
        "result": _json(fields.get("result")) if status == "done" else None,
        "error": error,
        "expires_at": expires,
    }


def queued_document(task: QueuedTask) -> dict[str, Any]:
    """A task as submit answers it: just queued."""
    return {
        "id": task.id,
        "object": OBJECT,
        "status": "queued",
        "model": task.model,
        "endpoint": task.endpoint,
        "created_at": task.created_ms / 1000,
        "started_at": None,
        "finished_at": None,
        "deadline": task.deadline_ms / 1000 if task.deadline_ms else None,
        "attempts": 0,
        "result": None,
        "error": None,
        "expires_at": task.expires_ms / 1000,
    }
