"""Write async tasks into Valkey exactly as the gateway's submit does (gateway/async_tasks/
layout.py), and read them back as pollers do: the batcher's tests need no gateway.

The gateway's own submit (``POST /v1/async/...``, submit.lua) is written in parallel with the
batcher; until it lands these helpers are the producer side of the contract. They follow the
contract's every key and field; a test of the gateway's submit should hold the two equal.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, cast

import orjson
import valkey

from gateway.async_tasks import layout
from ops.processes import wait_until


def now_ms() -> int:
    return int(time.time() * 1000)


def submit(
    client: valkey.Valkey,
    *,
    model: str,
    endpoint: str,
    body: dict[str, Any],
    use_case_id: int,
    tenant: str = "acme",
    priority_class: str = "",
    partitions: int = 2,
    deadline_ms: int = 0,
    queue_ttl_s: float = 600.0,
    result_ttl_s: int = 600,
    callback_url: str = "",
    estimate: int = 10,
    created_ms: int | None = None,
) -> str:
    """One task, queued: its hash, its stream entry, the model's registry entry and depth."""
    task_id = layout.TASK_ID_PREFIX + secrets.token_hex(12)
    created = now_ms() if created_ms is None else created_ms
    expires = created + int(queue_ttl_s * 1000)
    partition = layout.partition_of(task_id, partitions)
    with client.pipeline(transaction=True) as pipe:
        pipe.hsetnx(layout.partitions_registry(), model, str(partitions))
        pipe.hset(
            layout.task(task_id),
            mapping={
                "status": "queued",
                "use_case_id": use_case_id,
                "tenant": tenant,
                "model": model,
                "endpoint": endpoint,
                "created_ms": created,
                "deadline_ms": deadline_ms,
                "expires_ms": expires,
                "attempts": 0,
                "result_ttl_s": result_ttl_s,
            },
        )
        pipe.pexpire(layout.task(task_id), int(queue_ttl_s * 1000) + 60_000)
        entry: dict[str, str | int | bytes] = {
            "task": task_id,
            "endpoint": endpoint,
            "model": model,
            "use_case_id": use_case_id,
            "tenant": tenant,
            "priority_class": priority_class,
            "estimate": estimate,
            "created_ms": created,
            "deadline_ms": deadline_ms,
            "expires_ms": expires,
            "callback_url": callback_url,
            "body": orjson.dumps({"model": model, **body}),
        }
        pipe.xadd(layout.stream(model, partition), entry)  # type: ignore[type-var]
        pipe.incr(layout.depth(model))
        pipe.execute()
    return task_id


def view(client: valkey.Valkey, task_id: str) -> dict[str, Any]:
    """The task's hash as text, ``result`` and ``error`` parsed; {} when gone."""
    raw = client.hgetall(layout.task(task_id))
    fields: dict[str, Any] = {k.decode(): v.decode() for k, v in raw.items()}
    for name in ("result", "error"):
        if fields.get(name):
            fields[name] = orjson.loads(fields[name])
    return fields


def status(client: valkey.Valkey, task_id: str) -> str | None:
    raw = cast(bytes | None, client.hget(layout.task(task_id), "status"))
    return raw.decode() if raw is not None else None


def depth(client: valkey.Valkey, model: str) -> int:
    """The model's backlog counter (tasks submitted and not yet ended)."""
    return int(cast(bytes | None, client.get(layout.depth(model))) or 0)


def wait_ended(
    client: valkey.Valkey, task_ids: list[str], timeout: float = 20.0
) -> list[dict[str, Any]]:
    """Every task's view once all have ended; AssertionError naming those that did not."""

    def ended() -> bool:
        return all(status(client, t) in layout.TERMINAL for t in task_ids)

    if not wait_until(ended, timeout=timeout, interval=0.05):
        pending = {
            t: view(client, t).get("status")
            for t in task_ids
            if view(client, t).get("status") not in layout.TERMINAL
        }
        raise AssertionError(f"{len(pending)} of {len(task_ids)} tasks did not end: {pending}")
    return [view(client, t) for t in task_ids]
