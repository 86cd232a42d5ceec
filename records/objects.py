"""Transcript objects in object storage: their names, their format, reading and verifying them.

The contract between the persister that writes them (records/interactions.py) and everything
that reads them (the portal, the API, exports, retention).

An object holds one persister batch's transcripts of one use case finished in one hour
(UTC): JSON Lines (one ``TranscriptLine`` per request), gzip-compressed, then sealed
(records/sealing.py). Its name is deterministic from the batch, so a batch written again
after a crash overwrites the same object::

    transcripts/tenant=<id>/use_case=<id>/<YYYY>/<MM>/<DD>/<HH>/<first>_<last>.jsonl.gz.sealed

(``first`` and ``last``: the batch's first and last stream entry ids).

Checksums: ``sha256`` of the plaintext JSON Lines and ``sealed_sha256`` of the stored bytes,
kept on the ``RecordObject`` row and in the audit event written when it was stored; each
``InteractionRecord`` keeps its own line's ``content_sha256``.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

import orjson
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages

from records.sealing import SealError, seal, sealed_key_id, unseal

RECORDS_STORAGE = "records"  # the STORAGES alias (config/settings.py)


class TranscriptLine(TypedDict):
    """One request's transcript as stored. ``request`` / ``response`` are the bytes as
    forwarded / answered, as text when they are UTF-8 (``*_encoding`` "utf-8"), else base64."""

    record_id: str
    request_id: str
    at_ms: int
    tenant: str
    use_case_id: int
    key_id: int | None
    model: str
    endpoint: str
    status: int
    streamed: bool
    request: str
    request_encoding: str
    response: str
    response_encoding: str
    response_type: str
    truncated: bool


def text_field(data: bytes) -> tuple[str, str]:
    """Bytes as (text, encoding) for a TranscriptLine."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode(), "base64"


def field_bytes(line: TranscriptLine | dict[str, Any], name: str) -> bytes:
    """``request`` or ``response`` of a line back as the exact bytes."""
    value = str(line.get(name, ""))
    if line.get(f"{name}_encoding") == "base64":
        return base64.b64decode(value)
    return value.encode("utf-8")


def object_key(
    *, tenant_id: int | None, use_case_id: int, hour: datetime, first: str, last: str
) -> str:
    return (
        f"transcripts/tenant={tenant_id if tenant_id is not None else 'none'}"
        f"/use_case={use_case_id}/{hour:%Y/%m/%d/%H}/{first}_{last}.jsonl.gz.sealed"
    )


@dataclass(frozen=True)
class EncodedObject:
    sealed: bytes  # what is stored
    sha256: str  # of the plaintext JSON Lines
    sealed_sha256: str
    line_sha256: list[str]  # per line, in order
    key_id: str  # the key-encryption key that sealed it


def encode_object(lines: Sequence[TranscriptLine]) -> EncodedObject:
    raw_lines = [orjson.dumps(line) for line in lines]
    plaintext = b"".join(line + b"\n" for line in raw_lines)
    sealed = seal(gzip.compress(plaintext, compresslevel=6, mtime=0))
    return EncodedObject(
        sealed=sealed,
        sha256=hashlib.sha256(plaintext).hexdigest(),
        sealed_sha256=hashlib.sha256(sealed).hexdigest(),
        line_sha256=[hashlib.sha256(line).hexdigest() for line in raw_lines],
        key_id=sealed_key_id(sealed),
    )


class ObjectUnreadable(Exception):
    """An object is missing, will not open (tampered, unknown key) or does not match."""


def decode_object(sealed: bytes) -> list[bytes]:
    """The JSON Lines of a stored object, each without its newline."""
    try:
        plaintext = gzip.decompress(unseal(sealed))
    except (SealError, OSError, EOFError) as exc:
        raise ObjectUnreadable(str(exc)) from exc
    return plaintext.splitlines()


_bucket_checked: set[str] = set()
_bucket_lock = threading.Lock()


def records_storage() -> Storage:
    """The records storage, its bucket created if missing (checked once per process)."""
    storage = storages[RECORDS_STORAGE]
    ensure_bucket(storage)
    return storage


def ensure_bucket(storage: Storage) -> None:
    """Create the S3 bucket behind ``storage`` if it does not exist (no-op on a filesystem)."""
    bucket_name = getattr(storage, "bucket_name", None)
    if bucket_name is None:
        return
    marker = f"{getattr(storage, 'endpoint_url', '')}/{bucket_name}"
    with _bucket_lock:
        if marker in _bucket_checked:
            return
        client: Any = storage.connection.meta.client  # type: ignore[attr-defined]
        try:
            client.head_bucket(Bucket=bucket_name)
        except client.exceptions.ClientError:
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                client.create_bucket(Bucket=bucket_name)
        _bucket_checked.add(marker)


def write_object(key: str, encoded: EncodedObject) -> None:
    storage = records_storage()
    storage.save(key, ContentFile(encoded.sealed))


def read_object(key: str) -> bytes:
    storage = records_storage()
    try:
        with storage.open(key, "rb") as handle:
            data: bytes = handle.read()
    except (FileNotFoundError, OSError) as exc:
        raise ObjectUnreadable(f"object {key} could not be read: {exc}") from exc
    except Exception as exc:  # botocore's ClientError (NoSuchKey, AccessDenied…)
        raise ObjectUnreadable(f"object {key} could not be read: {exc}") from exc
    return data


def delete_object(key: str) -> None:
    records_storage().delete(key)


@dataclass(frozen=True)
class Verification:
    ok: bool
    problem: str = ""


def verify_sealed(sealed: bytes, *, sha256: str, sealed_sha256: str) -> Verification:
    """Whether stored bytes are the object that was recorded: both checksums and the seal."""
    if hashlib.sha256(sealed).hexdigest() != sealed_sha256:
        return Verification(False, "the stored bytes differ from the checksum recorded")
    try:
        lines = decode_object(sealed)
    except ObjectUnreadable as exc:
        return Verification(False, f"the object does not open: {exc}")
    plaintext = b"".join(line + b"\n" for line in lines)
    if hashlib.sha256(plaintext).hexdigest() != sha256:
        return Verification(False, "the content differs from the checksum recorded")
    return Verification(True)


class ObjectCache:
    """Decoded objects by (key, sealed checksum), the last few: an export or a page reads
    many lines of the same object one after another."""

    def __init__(self, size: int = 8) -> None:
        self._size = size
        self._lines: OrderedDict[tuple[str, str], list[bytes]] = OrderedDict()

    def lines(self, key: str, sealed_sha256: str) -> list[bytes]:
        marker = (key, sealed_sha256)
        found = self._lines.get(marker)
        if found is not None:
            self._lines.move_to_end(marker)
            return found
        sealed = read_object(key)
        if hashlib.sha256(sealed).hexdigest() != sealed_sha256:
            raise ObjectUnreadable(f"object {key} differs from the checksum recorded")
        lines = decode_object(sealed)
        self._lines[marker] = lines
        if len(self._lines) > self._size:
            self._lines.popitem(last=False)
        return lines

    def line(self, key: str, sealed_sha256: str, index: int, line_sha256: str) -> TranscriptLine:
        lines = self.lines(key, sealed_sha256)
        if index >= len(lines):
            raise ObjectUnreadable(f"object {key} has no line {index}")
        raw = lines[index]
        if hashlib.sha256(raw).hexdigest() != line_sha256:
            raise ObjectUnreadable(f"line {index} of object {key} differs from its checksum")
        line: TranscriptLine = orjson.loads(raw)
        return line
