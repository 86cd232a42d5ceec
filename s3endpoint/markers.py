"""One upload per registration, held atomically in Valkey, and the completion event.

``sy:s3:upload:{sy:uploads}:<registration id>`` is taken with ``SET NX`` before any byte is
stored: ``put``
while a PutObject is in flight, ``mp:<upload id>`` for a multipart upload, ``done`` once the
object is complete. A second upload, even one racing the first before the registration's state
moves on, finds the marker and is refused. A failed PutObject or an aborted multipart upload
gives the marker back. ``sy:s3:parts:{sy:uploads}:<registration id>`` holds a multipart
upload's part sizes, each reserved atomically (``reserve_part.lua``) before the part's bytes
are stored: parts sent at once cannot together pass the registration's cap. An upload left
unfinished is aborted, and its marker given back, by scheduler/files/upload_expiry.py.

Both carry the hash tag ``{sy:uploads}``: a tag hashes like the key ``sy:uploads`` (the
completion stream, UPLOADS_STREAM), so on a Valkey Cluster the markers, the parts and the stream
share one slot and ``finish`` stays one MULTI (docs/valkey-ha.md). Uploads are few; one slot
for all of them costs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import valkey.asyncio as avalkey

from runtime.valkey_urls import async_transaction
from scheduler.files.upload_events import (
    UPLOADS_MAXLEN,
    UPLOADS_SLOT_TAG,
    UPLOADS_STREAM,
    UploadEvent,
    upload_marker_key,
    upload_parts_key,
)

IN_FLIGHT_TTL = 3600  # a PutObject whose process died frees the registration after this
MULTIPART_TTL = 7 * 24 * 3600  # S3 keeps unfinished multipart uploads for days, too
DONE_TTL = 30 * 24 * 3600  # beyond any registration's deadline
PUT = "put"
DONE = "done"


SLOT_TAG = UPLOADS_SLOT_TAG
marker_key = upload_marker_key
parts_key = upload_parts_key
_RESERVE_PART_LUA = (Path(__file__).resolve().parent / "reserve_part.lua").read_text()


class Markers:
    def __init__(self, client: avalkey.Valkey) -> None:
        self.client = client
        self._reserve_part = client.register_script(_RESERVE_PART_LUA)

    async def claim(self, registration_id: int, value: str, ttl: int) -> bool:
        return bool(await self.client.set(marker_key(registration_id), value, nx=True, ex=ttl))

    async def value(self, registration_id: int) -> str | None:
        raw: Any = await self.client.get(marker_key(registration_id))
        return raw.decode() if isinstance(raw, bytes) else raw

    async def set(self, registration_id: int, value: str, ttl: int) -> None:
        await self.client.set(marker_key(registration_id), value, ex=ttl)

    async def release(self, registration_id: int, expected: str) -> None:
        """Give the marker back only if it is still ours (never a finished upload's)."""
        if await self.value(registration_id) == expected:
            await self.client.delete(marker_key(registration_id), parts_key(registration_id))

    async def reserve_part(self, registration_id: int, part: int, size: int, cap: int) -> bool:
        """Reserve ``size`` bytes for ``part`` (replacing its earlier self, if re-sent); False,
        and nothing reserved, if the upload's parts would then pass ``cap``."""
        reserved = await self._reserve_part(
            keys=[parts_key(registration_id)], args=[part, size, cap, MULTIPART_TTL]
        )
        return bool(reserved)

    async def finish(self, registration_id: int, event: UploadEvent) -> None:
        """Mark the upload done and announce it (the consumer in scheduler/ takes it on)."""
        pipe = await async_transaction(self.client, UPLOADS_STREAM)
        pipe.set(marker_key(registration_id), DONE, ex=DONE_TTL)
        pipe.delete(parts_key(registration_id))
        pipe.xadd(UPLOADS_STREAM, event.fields(), maxlen=UPLOADS_MAXLEN, approximate=True)
        await pipe.execute()
