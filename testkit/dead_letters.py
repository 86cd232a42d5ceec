"""Dead-lettered async tasks, written as the batcher leaves them (gateway/async_tasks/layout.py):
an entry on the dead-letter stream with ENTRY_FIELDS + DEAD_LETTER_FIELDS, and the task's hash
ended ``failed`` with ``dead_lettered=1``, living for its result lifetime."""

from __future__ import annotations

import itertools
import time
from typing import Any, cast

import orjson
import valkey

from gateway.async_tasks import layout
from governance.models import UseCase

PARTITIONS = 4
RESULT_TTL_S = 600
_numbers = itertools.count(1)


def now_ms() -> int:
    return int(time.time() * 1000)


def pttl(client: valkey.Valkey, key: str) -> int:
    return cast(int, client.pttl(key))


def status_of(client: valkey.Valkey, task_id: str) -> str | None:
    status = cast(bytes | None, client.hget(layout.task(task_id), "status"))
    return status.decode() if status is not None else None


def entry_of(client: valkey.Valkey, stream: str, entry_id: str) -> dict[str, str]:
    """One entry's fields ("-": the stream's first), or {} when there is none."""
    found = cast(
        list[tuple[bytes, dict[bytes, bytes]]],
        client.xrange(stream, min=entry_id, max="+" if entry_id == "-" else entry_id, count=1),
    )
    return {k.decode(): v.decode() for k, v in found[0][1].items()} if found else {}


def dead_letter(
    client: valkey.Valkey,
    use_case: UseCase,
    *,
    model: str = "embed",
    message: str = "upstream answered 503 three times",
    failed_ms: int | None = None,
    deadline_ms: int = 0,
    **entry: Any,
) -> tuple[str, str, dict[str, str]]:
    """(dead letter id, task id, the entry's fields) of a task that failed its last attempt."""
    task_id = f"{layout.TASK_ID_PREFIX}{next(_numbers):024x}"
    created = now_ms() - 60_000
    failed = failed_ms if failed_ms is not None else now_ms()
    stream = layout.stream(model, layout.partition_of(task_id, PARTITIONS))
    error = orjson.dumps(
        {"message": message, "type": "server_error", "code": "upstream_unavailable"}
    ).decode()
    fields: dict[str, str] = {
        "task": task_id,
        "endpoint": "/v1/embeddings",
        "model": model,
        "use_case_id": str(use_case.pk),
        "tenant": use_case.tenant.slug,
        "priority_class": "batch",
        "estimate": "12",
        "created_ms": str(created),
        "deadline_ms": str(deadline_ms),
        "expires_ms": str(created + 3_600_000),
        "callback_url": "",
        "body": orjson.dumps({"model": model, "input": ["hello", "world"]}).decode(),
        "error": error,
        "attempts": str(layout.MAX_ATTEMPTS),
        "failed_ms": str(failed),
        "stream": stream,
    }
    fields.update({k: str(v) for k, v in entry.items()})
    assert set(fields) == {*layout.ENTRY_FIELDS, *layout.DEAD_LETTER_FIELDS}
    entry_id = cast(bytes, client.xadd(layout.dead_letters(), fields)).decode()
    client.hset(
        layout.task(task_id),
        mapping={
            "status": "failed",
            "use_case_id": str(use_case.pk),
            "tenant": use_case.tenant.slug,
            "model": model,
            "endpoint": "/v1/embeddings",
            "created_ms": str(created),
            "deadline_ms": str(deadline_ms),
            "expires_ms": fields["expires_ms"],
            "attempts": str(layout.MAX_ATTEMPTS),
            "result_ttl_s": str(RESULT_TTL_S),
            "started_ms": str(failed - 100),
            "finished_ms": str(failed),
            "status_code": "503",
            "error": error,
            "dead_lettered": "1",
        },
    )
    client.expire(layout.task(task_id), RESULT_TTL_S)
    return entry_id, task_id, fields
