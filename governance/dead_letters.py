"""Async tasks' dead letters for people: list them, replay one, discard one (docs/async.md).

The batcher moves a task that failed ``MAX_ATTEMPTS`` times to the dead-letter stream with its
error (gateway/async_tasks/layout.py). Officers and admins see every tenant's dead letters and
decide what becomes of each; auditors see them all and change nothing; developers see their
own tenants' only. A dead letter outside a person's scope is "not found", never "forbidden".

The stream is read and written here by the layout contract, with the web process's own
Valkey client: the batcher's module is not a dependency of the web process. A replay is one
Lua call (dead_letter_replay.lua) that re-adds the entry, resets the task and deletes the dead
letter together, so that a double click cannot queue a task twice. Every replay and discard
is in the audit trail with its actor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Final, cast

import orjson
import valkey
from django.conf import settings
from django.core.exceptions import PermissionDenied

from gateway.async_tasks import layout
from governance.audit import Actor, audit_record
from governance.errors import Conflict, NotFound
from governance.models import UseCase
from governance.roles import AnyUser, can_govern, can_read_everything
from governance.selectors import use_cases_visible
from governance.store import valkey_client

MAX_PAGE: Final = 200
# A stream entry id, "<ms>-<seq>", each part an unsigned 64-bit number; anything else cannot
# name a dead letter (and Valkey would refuse it as a range bound).
_ENTRY_ID = re.compile(r"(\d{1,20})-(\d{1,20})")
_U64_MAX: Final = 2**64 - 1
# How many entries a scoped listing reads per round trip while it looks for visible ones.
_SCAN_CHUNK: Final = 200
# What XRANGE answers: (id, fields) pairs, bytes as stored.
Entries = list[tuple[bytes, dict[bytes, bytes]]]
_REPLAY_LUA: Final = Path(__file__).with_name("dead_letter_replay.lua")
# The result lifetime a rebuilt task hash gets when its use case is gone (the model's default).
_DEFAULT_RESULT_TTL_S: Final = 600


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered task, as officers see it (never its request body)."""

    entry_id: str
    task_id: str
    endpoint: str
    model: str
    use_case_id: int | None
    tenant: str
    priority_class: str
    error: str  # the last failure's message
    attempts: int
    failed_at: datetime | None
    created_at: datetime | None
    stream: str


@dataclass(frozen=True)
class DeadLetterPage:
    letters: list[DeadLetter]
    # Pass as ``before`` for the next (older) page; None when this is the oldest.
    next_before: str | None


@dataclass(frozen=True)
class Replayed:
    letter: DeadLetter
    stream_entry_id: str  # the task's new entry in its partition stream


# --- reading --------------------------------------------------------------------------------
def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _time(ms: str) -> datetime | None:
    millis = _int(ms)
    return datetime.fromtimestamp(millis / 1000, tz=UTC) if millis else None


def _message(error: str) -> str:
    """The error's words: the batcher stores an OpenAI error object (JSON) or plain text."""
    try:
        parsed = orjson.loads(error)
    except orjson.JSONDecodeError:
        return error
    if isinstance(parsed, dict):
        inner = parsed.get("error", parsed)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    return error


def _letter(entry_id: bytes | str, raw: dict[bytes, bytes]) -> DeadLetter:
    fields = {_text(k): _text(v) for k, v in raw.items()}
    get = fields.get
    return DeadLetter(
        entry_id=_text(entry_id),
        task_id=get("task", ""),
        endpoint=get("endpoint", ""),
        model=get("model", ""),
        use_case_id=_int(get("use_case_id", "")),
        tenant=get("tenant", ""),
        priority_class=get("priority_class", ""),
        error=_message(get("error", "")),
        attempts=_int(get("attempts", "")) or 0,
        failed_at=_time(get("failed_ms", "")),
        created_at=_time(get("created_ms", "")),
        stream=get("stream", ""),
    )


def is_entry_id(value: str) -> bool:
    """Whether ``value`` can be a stream entry's id (a dead letter's, a page cursor)."""
    parts = _ENTRY_ID.fullmatch(value)
    return parts is not None and all(int(part) <= _U64_MAX for part in parts.groups())


def _visible_use_case_ids(user: AnyUser | None) -> set[int] | None:
    """None: every dead letter; else the use cases whose dead letters the person may see."""
    if user is None or can_read_everything(user):
        return None
    return set(use_cases_visible(user).values_list("pk", flat=True))


def _sees(visible: set[int] | None, letter: DeadLetter) -> bool:
    return visible is None or letter.use_case_id in visible


def dead_letters_list(
    *,
    user: AnyUser | None,
    count: int = 50,
    before: str | None = None,
    client: valkey.Valkey | None = None,
) -> DeadLetterPage:
    """The dead letters a person may see, newest first, ``count`` at most, older than
    ``before`` (an entry id from the previous page's ``next_before``)."""
    if not 1 <= count <= MAX_PAGE:
        raise ValueError(f"count must be between 1 and {MAX_PAGE}")
    if before is not None and not is_entry_id(before):
        raise ValueError("before must be a dead letter's id, such as 1732700000000-0")
    if before == "0-0":
        return DeadLetterPage(letters=[], next_before=None)  # nothing is older than the first id
    client = client or valkey_client()
    visible = _visible_use_case_ids(user)
    found: list[DeadLetter] = []
    upper = f"({before}" if before else "+"
    # One more than asked for says whether an older page exists.
    while len(found) <= count:
        chunk = cast(
            Entries,
            client.xrevrange(layout.dead_letters(), max=upper, min="-", count=_SCAN_CHUNK),
        )
        if not chunk:
            break
        for entry_id, raw in chunk:
            letter = _letter(entry_id, raw)
            if _sees(visible, letter):
                found.append(letter)
        upper = f"({_text(chunk[-1][0])}"
        if len(chunk) < _SCAN_CHUNK:
            break
    page = found[:count]
    more = len(found) > count
    return DeadLetterPage(letters=page, next_before=page[-1].entry_id if more else None)


def dead_letter_get(
    *, user: AnyUser | None, entry_id: str, client: valkey.Valkey | None = None
) -> DeadLetter:
    """One dead letter the person may see; NotFound for one that is gone or not theirs."""
    if not is_entry_id(entry_id):
        raise NotFound(f"No dead letter {entry_id!r}.")
    client = client or valkey_client()
    found = cast(Entries, client.xrange(layout.dead_letters(), min=entry_id, max=entry_id))
    if not found:
        raise NotFound(f"No dead letter {entry_id}: it was replayed, discarded or never was.")
    letter = _letter(*found[0])
    if not _sees(_visible_use_case_ids(user), letter):
        raise NotFound(f"No dead letter {entry_id}: it was replayed, discarded or never was.")
    return letter


# --- deciding -------------------------------------------------------------------------------
def _decider(actor: Actor, entry_id: str, client: valkey.Valkey) -> DeadLetter:
    """The dead letter, if the actor may decide about it: unseen is 404, seen but not an
    officer's or admin's (an auditor, a developer) is 403."""
    if actor.is_system:
        return dead_letter_get(user=None, entry_id=entry_id, client=client)
    if actor.user is None or not actor.user.is_authenticated:
        raise PermissionDenied("Sign in first.")
    letter = dead_letter_get(user=actor.user, entry_id=entry_id, client=client)
    if not can_govern(actor.user):
        raise PermissionDenied("Only a governance officer or an admin may replay or discard.")
    return letter


def _use_case(letter: DeadLetter) -> UseCase | None:
    if letter.use_case_id is None:
        return None
    return UseCase.objects.select_related("tenant").filter(pk=letter.use_case_id).first()


def _audit(actor: Actor, action: str, letter: DeadLetter, **extra: Any) -> None:
    use_case = _use_case(letter)
    audit_record(
        actor=actor,
        action=action,
        object_repr=f"async task {letter.task_id}",
        after={
            "task": letter.task_id,
            "dead_letter": letter.entry_id,
            "model": letter.model,
            "endpoint": letter.endpoint,
            "use_case_id": letter.use_case_id,
            "error": letter.error,
            "attempts": letter.attempts,
            **extra,
        },
        tenant_slug=use_case.tenant.slug if use_case else letter.tenant,
        tenant_id=use_case.tenant_id if use_case else None,
    )


@lru_cache(maxsize=1)
def replay_lua_source() -> str:
    return _REPLAY_LUA.read_text()


_CONFLICTS: Final = {
    "deadline": "Its deadline has passed: running it now would only expire it. Discard it.",
    "stream": "The dead letter names another stream than its task's; it cannot be replayed.",
}


def dead_letter_replay(
    *, actor: Actor, entry_id: str, client: valkey.Valkey | None = None
) -> Replayed:
    """Put the task back in its stream with its attempts reset (status queued), at most once.

    NotFound when the dead letter is gone (a second click, or someone discarded it); Conflict
    when its task cannot run again (its deadline passed, or it is no longer failed)."""
    client = client or valkey_client()
    letter = _decider(actor, entry_id, client)
    use_case = _use_case(letter)
    stream = letter.stream
    if not stream:
        raise Conflict("The dead letter does not name its stream; it cannot be replayed.")
    script = client.register_script(replay_lua_source())
    now_ms = int(datetime.now(tz=UTC).timestamp() * 1000)
    answer = script(
        keys=[
            layout.dead_letters(),
            stream,
            layout.task(letter.task_id),
            layout.depth(letter.model),
        ],
        args=[
            entry_id,
            now_ms,
            settings.ASYNC_QUEUE_TTL_SECONDS * 1000,
            use_case.async_result_ttl_seconds if use_case else _DEFAULT_RESULT_TTL_S,
            *layout.ENTRY_FIELDS,
        ],
    )
    outcome = [_text(part) for part in answer]
    if outcome[0] == "gone":
        raise NotFound(f"No dead letter {entry_id}: it was replayed or discarded meanwhile.")
    if outcome[0] == "conflict":
        reason = outcome[1]
        if reason.startswith("status:"):
            raise Conflict(
                f"Task {letter.task_id} is {reason.removeprefix('status:')}, not failed: "
                "another copy of it ran or is queued. Discard the dead letter."
            )
        raise Conflict(_CONFLICTS.get(reason, reason))
    _audit(actor, "async.dead_letter_replay", letter, stream=stream, stream_entry=outcome[1])
    return Replayed(letter=letter, stream_entry_id=outcome[1])


def dead_letter_discard(
    *, actor: Actor, entry_id: str, client: valkey.Valkey | None = None
) -> DeadLetter:
    """Drop a dead letter for good; its task stays failed until its result lifetime ends."""
    client = client or valkey_client()
    letter = _decider(actor, entry_id, client)
    if not client.xdel(layout.dead_letters(), entry_id):
        raise NotFound(f"No dead letter {entry_id}: it was replayed or discarded meanwhile.")
    _audit(actor, "async.dead_letter_discard", letter)
    return letter
