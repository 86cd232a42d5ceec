"""Dead letters for officers: list them, replay one (the portal's page calls these from the
web process, so they take a sync valkey client).

A task lands on the dead-letter stream (layout.dead_letters()) after layout.MAX_ATTEMPTS
failed attempts, with its stream entry (ENTRY_FIELDS) and DEAD_LETTER_FIELDS; its task hash
says ``failed`` with ``dead_lettered=1`` until its result lifetime passes. A replay puts the
entry back on its partition stream as a fresh task under the same id: attempts 0, status
queued, its queue time limit counted from the replay; the letter leaves the DLQ.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import valkey

from gateway.async_tasks import layout

_REPLAY = (Path(__file__).resolve().parent / "replay.lua").read_text()


class DeadLetterNotFound(KeyError):
    """No such letter (never was, or replayed already)."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    entry_id: str
    task_id: str
    endpoint: str
    model: str
    use_case_id: str
    tenant: str
    error: dict[str, Any]
    attempts: int
    failed_ms: int
    created_ms: int
    stream: str
    fields: dict[str, str]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _letter(entry_id: bytes | str, raw: dict[Any, Any]) -> DeadLetter:
    fields = {_text(k): _text(v) for k, v in raw.items()}
    try:
        error = orjson.loads(fields.get("error") or "{}")
    except orjson.JSONDecodeError:
        error = {"message": fields.get("error", "")}

    def number(name: str) -> int:
        try:
            return int(fields.get(name) or 0)
        except ValueError:
            return 0

    return DeadLetter(
        entry_id=_text(entry_id),
        task_id=fields.get("task", ""),
        endpoint=fields.get("endpoint", ""),
        model=fields.get("model", ""),
        use_case_id=fields.get("use_case_id", ""),
        tenant=fields.get("tenant", ""),
        error=error if isinstance(error, dict) else {"message": str(error)},
        attempts=number("attempts"),
        failed_ms=number("failed_ms"),
        created_ms=number("created_ms"),
        stream=fields.get("stream", ""),
        fields=fields,
    )


def list_dead_letters(
    client: valkey.Valkey, count: int = 50, after: str | None = None
) -> list[DeadLetter]:
    """Up to ``count`` letters, oldest first, after the entry id ``after`` (a page's last)."""
    start = f"({after}" if after else "-"
    entries = client.xrange(layout.dead_letters(), min=start, max="+", count=max(count, 1))
    return [_letter(entry_id, fields) for entry_id, fields in entries]  # type: ignore[union-attr]


def replay(client: valkey.Valkey, entry_id: str) -> str:
    """Queue the letter's task again; returns its task id. DeadLetterNotFound if gone."""
    found = client.xrange(layout.dead_letters(), min=entry_id, max=entry_id)
    if not found:
        raise DeadLetterNotFound(entry_id)
    letter = _letter(*found[0])  # type: ignore[index]
    if not letter.stream or not letter.task_id:
        raise DeadLetterNotFound(entry_id)
    now = int(time.time() * 1000)
    queue_ttl_ms = max(int(letter.fields.get("expires_ms") or 0) - letter.created_ms, 0)
    expires_ms = now + queue_ttl_ms if queue_ttl_ms else 0
    entry: list[str] = []
    for name in layout.ENTRY_FIELDS:
        value = str(expires_ms) if name == "expires_ms" else letter.fields.get(name, "")
        entry += [name, value]
    # The hash outlives the queue time limit by a margin, as at submit.
    hash_ttl_ms = (queue_ttl_ms or 24 * 3600 * 1000) + 60_000
    script = client.register_script(_REPLAY)
    replayed = script(
        keys=[
            layout.dead_letters(),
            letter.stream,
            layout.task(letter.task_id),
            layout.depth(letter.model),
        ],
        args=[entry_id, now, expires_ms, hash_ttl_ms, *entry],
    )
    if not replayed:
        raise DeadLetterNotFound(entry_id)
    return letter.task_id
