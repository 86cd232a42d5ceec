"""Reading a person's async tasks out of Valkey for the "My work" page.

The task store (gateway/async_tasks/layout.py) keys each task by its id only: there is no
index of tasks by use case, and the streams lose a task once it ends (XDEL). Adding an index
would mean another write in the gateway's submit script for every task, paid by every
client, to serve a page a few people open. Instead this reads the task hashes themselves with
``SCAN … MATCH <task prefix>* TYPE hash``, which is correct (every live task is a hash under
that prefix, and hashes expire with the task's TTL, so the set stays the live tasks only) and
bounded: one page examines at most ``SCAN_CALLS`` × ``SCAN_COUNT`` keys and reads only the
short fields of those under the prefix (never a result body), then hands back SCAN's cursor
so the next page carries on where this one stopped. SCAN runs on Valkey, not on the
gateway's processes: nothing is added to the hot path.

SCAN's order is the hash table's, not time: a page is sorted newest first within itself, and
a task created during the paging may or may not be seen (SCAN's own guarantee: every key that
exists throughout the scan is returned).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Final

import orjson
import valkey

from gateway.async_tasks import layout
from gateway.async_tasks.documents import fields_of, task_document
from governance.audit import Actor, audit_record
from governance.models import UseCase

# Fields a row shows: the result and the error bodies stay in Valkey (the error's message is
# read, capped, for failed tasks only).
ROW_FIELDS: Final = (
    "status",
    "use_case_id",
    "model",
    "endpoint",
    "created_ms",
    "deadline_ms",
    "finished_ms",
    "attempts",
)
SCAN_COUNT: Final = 1000  # keys Valkey looks at per SCAN call
SCAN_CALLS: Final = 8  # SCAN calls per page at most: ≤ 8,000 keys examined for one page
PAGE_ROWS: Final = 50  # stop scanning once a page has this many of the person's tasks
ERROR_CHARS: Final = 200
ACTIVE: Final = frozenset({"queued", "running"})


def _pattern() -> str:
    return layout.task(layout.TASK_ID_PREFIX + "*")


@dataclass(frozen=True, slots=True)
class TaskRow:
    id: str
    use_case_id: int
    status: str
    model: str
    endpoint: str
    created: dt.datetime | None
    deadline: dt.datetime | None
    finished: dt.datetime | None
    attempts: int
    error: str

    @property
    def active(self) -> bool:
        return self.status in ACTIVE


@dataclass(frozen=True, slots=True)
class TaskPage:
    rows: list[TaskRow]
    next_cursor: int | None  # None: the scan is complete
    examined: int  # SCAN calls made (each up to SCAN_COUNT keys)

    @property
    def any_active(self) -> bool:
        return any(row.active for row in self.rows)


def _time(value: bytes | None) -> dt.datetime | None:
    if not value or not int(value):
        return None
    return dt.datetime.fromtimestamp(int(value) / 1000, tz=dt.UTC)


def _text(value: bytes | None) -> str:
    return value.decode() if value else ""


def _error_message(raw: bytes | None) -> str:
    if not raw:
        return ""
    try:
        parsed: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return ""
    message = parsed.get("message", "") if isinstance(parsed, dict) else ""
    return str(message)[:ERROR_CHARS]


def _task_id(key: bytes | str) -> str:
    text = key.decode() if isinstance(key, bytes) else key
    return text.removeprefix(layout.task(""))


def tasks_page(
    client: valkey.Valkey,
    *,
    use_case_ids: Collection[int],
    cursor: int = 0,
    rows: int = PAGE_ROWS,
    count: int = SCAN_COUNT,
) -> TaskPage:
    """One page of the tasks of ``use_case_ids``, newest first within the page.

    Raises valkey.ValkeyError or OSError when the store cannot be reached."""
    wanted = {str(pk).encode() for pk in use_case_ids}
    found: list[TaskRow] = []
    calls = 0
    next_cursor: int | None = cursor
    if not wanted:
        return TaskPage(rows=[], next_cursor=None, examined=0)
    while next_cursor is not None and calls < SCAN_CALLS and len(found) < rows:
        reply: Any = client.scan(next_cursor, match=_pattern(), count=count, _type="hash")
        raw_cursor, keys = reply
        calls += 1
        next_cursor = int(raw_cursor) or None
        if not keys:
            continue
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hmget(key, [*ROW_FIELDS, "error"])
            replies: list[Any] = pipe.execute()  # type: ignore[no-untyped-call]
        for key, values in zip(keys, replies, strict=True):
            fields = dict(zip([*ROW_FIELDS, "error"], values, strict=True))
            if fields["use_case_id"] not in wanted or not fields["status"]:
                continue  # another use case's task, or one that expired since SCAN saw it
            status = _text(fields["status"])
            found.append(
                TaskRow(
                    id=_task_id(key),
                    use_case_id=int(fields["use_case_id"]),
                    status=status,
                    model=_text(fields["model"]),
                    endpoint=_text(fields["endpoint"]),
                    created=_time(fields["created_ms"]),
                    deadline=_time(fields["deadline_ms"]),
                    finished=_time(fields["finished_ms"]),
                    attempts=int(fields["attempts"] or 0),
                    error=_error_message(fields["error"]) if status != "done" else "",
                )
            )
    epoch = dt.datetime.min.replace(tzinfo=dt.UTC)
    found.sort(key=lambda row: (row.created or epoch, row.id), reverse=True)
    return TaskPage(rows=found, next_cursor=next_cursor, examined=calls)


def task_read(
    client: valkey.Valkey, *, actor: Actor, task_id: str, use_case_ids: Collection[int]
) -> dict[str, Any] | None:
    """The task as ``GET /v1/tasks/{id}`` answers it (documents.task_document), or None when
    it does not exist, has expired or belongs to a use case outside ``use_case_ids`` — the
    API's own rule: another use case's task is "not found", not "forbidden".

    Reading a task that has ended (its result or error is in the answer) is audited before
    the answer is sent: who, which task, its use case and tenant. A task still queued or
    running holds nothing to read yet."""
    if not task_id.startswith(layout.TASK_ID_PREFIX):
        return None
    reply: Any = client.hgetall(layout.task(task_id))
    fields = fields_of(reply)
    owner = fields.get("use_case_id", b"").decode()
    if not fields.get("status") or owner not in {str(pk) for pk in use_case_ids}:
        return None
    document = task_document(task_id, fields)
    if document["status"] in layout.TERMINAL:
        use_case = UseCase.objects.select_related("tenant").get(pk=int(owner))
        audit_record(
            actor=actor,
            action="async_task.read",
            object_repr=f"async task {task_id}",
            after={
                "task": task_id,
                "use_case_id": use_case.pk,
                "status": document["status"],
                "model": document["model"],
                "endpoint": document["endpoint"],
            },
            tenant_slug=use_case.tenant.slug,
            tenant_id=use_case.tenant_id,
        )
    return document
