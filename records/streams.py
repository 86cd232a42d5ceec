"""Exactly-once effects over the gateway's at-least-once Valkey streams: the machinery the
usage persister (``records.usage``) and the records persister (``records.interactions``)
share.

1. **One persister at a time per stream.** A batch takes the stream's ``StreamCursor`` row
   lock (``SELECT … FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` serialises writers anyway)
   and keeps it until it commits. A concurrent run finds the row locked and leaves.
2. **Orphans first.** Holding the lock, everything pending in the consumer group belongs to
   a run that has ended — it died before COMMIT, or between COMMIT and XACK. The batch
   claims all of it (``XAUTOCLAIM`` with no idle threshold: waiting for an idle time would
   let new entries be committed past the orphans) before it reads new entries
   (``XREADGROUP >``), so entries are committed in id order.
3. **A committed-id cursor.** The cursor advances to the batch's last id in the same
   transaction as the batch's effects; an entry at or below it was already committed (its
   run died before XACK) and is only acknowledged.
4. **Trimming only what is done.** After a run, the entries every consumer group of the
   stream has read and acknowledged are trimmed (``XTRIM MINID``, below the oldest entry
   still pending or undelivered in any group), but those acknowledged in the last
   ``keep_ms``; so a lagging persister loses nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, Protocol, cast

import valkey
from django.db import transaction

from gateway.accounting import PERSISTER_GROUP
from records.models import StreamCursor
from runtime.valkey_urls import sync_client

GROUP = PERSISTER_GROUP

StreamEntry = tuple[bytes, dict[bytes, bytes]]
# Called inside the batch's transaction with the entries not yet committed; what it writes
# commits with the cursor. It raises to abort the batch (nothing committed, nothing acked).
Store = Callable[[Sequence[StreamEntry]], None]


class BatchCounts(Protocol):
    claimed: int
    replayed: int


@cache
def client_for(url: str) -> valkey.Valkey:
    """One client per process and URL (the persisters run every few seconds)."""
    return sync_client(url, socket_timeout=10, socket_connect_timeout=5)


def stream_batch(
    client: valkey.Valkey,
    stream: str,
    consumer: str,
    batch_size: int,
    report: BatchCounts,
    store: Store,
    *,
    top_up: bool = True,
) -> int | None:
    """One batch in one transaction; the number of entries taken, None if another run holds
    the stream.

    ``top_up=False``: a batch of orphans is not filled up with new entries, so a batch that
    died is retried as exactly the same entries (the records persister names its objects
    after the batch's ids, and a retry then overwrites what the dead run wrote)."""
    StreamCursor.objects.get_or_create(stream=stream)
    with transaction.atomic():
        cursor = StreamCursor.objects.select_for_update(skip_locked=True).filter(stream=stream)
        locked = cursor.first()
        if locked is None:
            return None
        claimed = _claim_orphans(client, stream, consumer, batch_size)
        entries = list(claimed)
        if len(entries) < batch_size and (top_up or not entries):
            entries += _read_new(client, stream, consumer, batch_size - len(entries))
        if not entries:
            return 0
        last = parse_id(locked.last_id)
        fresh = [entry for entry in entries if parse_id(entry[0]) > last]
        report.claimed += len(claimed)
        report.replayed += len(entries) - len(fresh)
        if fresh:
            store(fresh)
            locked.last_id = max(fresh, key=lambda e: parse_id(e[0]))[0].decode()
            locked.save(update_fields=["last_id", "updated_at"])
    # After COMMIT: dying before this line only makes the next run see them as replays.
    client.xack(stream, GROUP, *[entry_id for entry_id, _ in entries])
    return len(entries)


def ensure_group(client: valkey.Valkey, stream: str) -> None:
    try:
        # From the stream's start: entries written before the first run count too.
        client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    except valkey.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def trim_consumed(client: valkey.Valkey, stream: str, keep_ms: int) -> int:
    """Trim the entries every consumer group has read and acknowledged, but those of the
    last ``keep_ms`` (entry ids are Valkey's clock); returns how many.

    The floor is the oldest entry any group still needs: its oldest pending one, or the one
    after its last delivered. No group: nothing is known to be read, nothing is trimmed.
    Entries delivered after the floor was read are above it, so a run reading meanwhile
    loses nothing."""
    groups = cast(list[dict[str, Any]], client.xinfo_groups(stream))
    if not groups:
        return 0
    seconds, microseconds = cast(tuple[int, int], client.time())
    floors = [f"{max(0, seconds * 1000 + microseconds // 1000 - keep_ms)}-0"]
    for group in groups:
        floor = _next_id(group["last-delivered-id"])
        if int(group["pending"]):
            oldest = cast(dict[str, Any], client.xpending(stream, group["name"]))["min"]
            # None: another persister acknowledged them meanwhile; the floor read before
            # stays (lower than what it is now, so nothing unread is trimmed).
            if oldest is not None:
                floor = min(floor, text_id(oldest), key=parse_id)
        floors.append(floor)
    return int(cast(int, client.xtrim(stream, minid=min(floors, key=parse_id), approximate=False)))


def unread(client: valkey.Valkey, stream: str) -> int:
    """Entries not yet delivered to the persister's group (its lag; the stream's length
    when Valkey cannot count it)."""
    for group in cast(list[dict[str, Any]], client.xinfo_groups(stream)):
        if text_id(group["name"]) == GROUP and group.get("lag") is not None:
            return int(group["lag"])
    return int(cast(int, client.xlen(stream)))


def parse_id(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def text_id(entry_id: bytes | str) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


def _next_id(entry_id: bytes | str) -> str:
    ms, seq = parse_id(entry_id)
    return f"{ms}-{seq + 1}"


def _claim_orphans(
    client: valkey.Valkey, stream: str, consumer: str, count: int
) -> list[StreamEntry]:
    claimed: list[StreamEntry] = []
    start: bytes | str = "0-0"
    while len(claimed) < count:
        reply = cast(
            list[Any],
            client.xautoclaim(
                stream, GROUP, consumer, min_idle_time=0, start_id=start, count=count - len(claimed)
            ),
        )
        start, entries = reply[0], reply[1]
        # Entries trimmed away (MAXLEN) come back as None payloads: nothing to persist.
        claimed += [(entry_id, fields) for entry_id, fields in entries if fields is not None]
        if start in (b"0-0", "0-0"):
            break
    return claimed


def _read_new(client: valkey.Valkey, stream: str, consumer: str, count: int) -> list[StreamEntry]:
    reply = cast(list[Any], client.xreadgroup(GROUP, consumer, {stream: ">"}, count=count))
    if not reply:
        return []
    return [(entry_id, fields) for entry_id, fields in reply[0][1]]
