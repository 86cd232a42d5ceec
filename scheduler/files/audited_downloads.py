"""Listening to and downloading a registration's original and outputs, each time audited.

The portal's pages and ``/api/files/<id>/original/`` (and ``…/outputs/<name>/``) both come
here: the caller has already found the registration among those it may see (a 404 otherwise);
this module resolves which object is meant, answers an HTTP ``Range`` (an ``<audio>`` element
seeks with them), records ``file.download`` — who, which object, which bytes — and streams the
object from ``storages["files"]`` in chunks, never whole into memory.

Every request is audited, a range as much as a whole file: an audio player fetches a file in
several ranges, and a person who wanted the whole file could ask for it a range at a time.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from botocore.exceptions import ClientError
from django.core.files.storage import Storage, storages
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase

from governance.audit import Actor, audit_record
from governance.models import FileRegistration
from governance.streamed_downloads import download_response

CHUNK_BYTES = 64 * 1024
ORIGINAL = "original"

CONTENT_TYPES: dict[str, str] = {
    ".wav": "audio/wav",
    ".mp3": "audio/mpeg",
    ".pdf": "application/pdf",
    ".txt": "text/plain; charset=utf-8",
    ".json": "application/json",
    ".jsonl": "application/x-ndjson",
    ".ndjson": "application/x-ndjson",
    ".vtt": "text/vtt; charset=utf-8",
}
DEFAULT_CONTENT_TYPE = "application/octet-stream"

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class ObjectMissing(LookupError):
    """The registration names no such object (no upload yet, no output of that name), or the
    bucket no longer holds it: the caller answers 404."""


class RangeNotSatisfiable(ValueError):
    """A ``Range`` that starts past the object's end: 416 with ``Content-Range: bytes */size``."""

    def __init__(self, size: int) -> None:
        super().__init__(f"The object has {size} bytes; the range asked for starts past its end.")
        self.size = size


@dataclass(frozen=True, slots=True)
class ByteRange:
    start: int
    end: int  # inclusive, as in Content-Range

    @property
    def length(self) -> int:
        return self.end - self.start + 1


@dataclass(frozen=True, slots=True)
class Download:
    """What the response needs: headers, and the chunks (the audit event is already written)."""

    object_name: str
    filename: str
    content_type: str
    size: int
    range: ByteRange | None
    chunks: Iterator[bytes]

    @property
    def length(self) -> int:
        return self.range.length if self.range else self.size


def content_type_for(name: str) -> str:
    """By the name's extension: the types the pipelines write, audio for the player."""
    return CONTENT_TYPES.get(PurePosixPath(name).suffix.lower(), DEFAULT_CONTENT_TYPE)


def safe_filename(name: str, fallback: str = "download") -> str:
    """A name safe in ``Content-Disposition``: the last path segment, ASCII letters, digits,
    dots, dashes and underscores only (a quote or a newline cannot break the header)."""
    base = PurePosixPath(name.replace("\\", "/")).name
    ascii_name = unicodedata.normalize("NFKD", base).encode("ascii", "ignore").decode()
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", ascii_name)
    cleaned = re.sub(r"_*\._*", ".", cleaned).strip("._")[:150]
    return cleaned or fallback


def parse_range(header: str, size: int) -> ByteRange | None:
    """One ``bytes=`` range of an object of ``size`` bytes, or None for the whole object.

    A header that does not parse, or asks for several ranges, is ignored (RFC 9110 §14.2 lets a
    server send the whole representation instead). A range starting at or past the end raises
    RangeNotSatisfiable; an end past the object's is cut to its last byte."""
    match = _RANGE.match(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # a suffix: the last N bytes
        suffix = int(last)
        if suffix == 0:
            raise RangeNotSatisfiable(size)
        return ByteRange(max(size - suffix, 0), size - 1) if size else None
    start = int(first)
    end = int(last) if last else size - 1
    if last and end < start:
        return None
    if start >= size:
        raise RangeNotSatisfiable(size)
    return ByteRange(start, min(end, size - 1))


def object_for(file: FileRegistration, which: str) -> tuple[str, str]:
    """(object name, download filename) of ``original`` or of the output named ``which``."""
    if which == ORIGINAL:
        if not file.source_object:
            raise ObjectMissing("The file has not been uploaded yet.")
        return file.source_object, safe_filename(file.filename, fallback=f"file-{file.pk}")
    outputs: dict[str, Any] = file.outputs or {}
    name = outputs.get(which)
    if not isinstance(name, str) or not name:
        raise ObjectMissing(f"The file has no output named '{which}'.")
    stem = PurePosixPath(safe_filename(file.filename, fallback=f"file-{file.pk}")).stem
    return name, safe_filename(f"{stem}-{PurePosixPath(name).name}")


def output_names(file: FileRegistration) -> list[str]:
    outputs: dict[str, Any] = file.outputs or {}
    return sorted(name for name, value in outputs.items() if isinstance(value, str) and value)


def file_download(
    *, actor: Actor, file: FileRegistration, which: str, range_header: str = ""
) -> Download:
    """Open the original (``which="original"``) or an output for reading, audit it, and hand
    back its chunks. Raises ObjectMissing (404) or RangeNotSatisfiable (416)."""
    object_name, filename = object_for(file, which)
    storage = storages["files"]
    try:
        size = storage.size(object_name)
    except FileNotFoundError as exc:  # the filesystem backend
        raise ObjectMissing("The object is no longer in the files bucket.") from exc
    except ClientError as exc:  # the S3 backend: a 404 is a missing object, the rest errors
        if _is_not_found(exc):
            raise ObjectMissing("The object is no longer in the files bucket.") from exc
        raise
    wanted = parse_range(range_header, size) if range_header else None
    after: dict[str, Any] = {"object": object_name, "which": which, "bytes": size}
    if wanted is not None:
        after["range"] = f"{wanted.start}-{wanted.end}"
    with transaction.atomic():
        audit_record(
            actor=actor,
            action="file.download",
            obj=file,
            after=after,
            tenant_slug=file.use_case.tenant.slug,
            object_repr=f"{file.use_case}: {file.filename}",
        )
    start, end = (wanted.start, wanted.end) if wanted else (0, size - 1)
    return Download(
        object_name=object_name,
        filename=filename,
        content_type=content_type_for(object_name if which != ORIGINAL else file.filename),
        size=size,
        range=wanted,
        chunks=_chunks(storage, object_name, start, end),
    )


def _is_not_found(exc: ClientError) -> bool:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    return code in {"404", "NoSuchKey", "NotFound"}


def _chunks(storage: Storage, name: str, start: int, end: int) -> Iterator[bytes]:
    """Bytes ``start``..``end`` (inclusive) of the object, CHUNK_BYTES at a time. On S3 one
    ranged GET streamed from the socket; elsewhere a seek on the opened file."""
    if end < start:
        return
    bucket = getattr(storage, "bucket", None)
    if bucket is not None and hasattr(storage, "_normalize_name"):
        from storages.utils import clean_name

        key = storage._normalize_name(clean_name(name))
        body = bucket.Object(key).get(Range=f"bytes={start}-{end}")["Body"]
        try:
            yield from body.iter_chunks(CHUNK_BYTES)
        finally:
            body.close()
        return
    with storage.open(name, "rb") as handle:
        handle.seek(start)
        left = end - start + 1
        while left > 0:
            chunk = handle.read(min(CHUNK_BYTES, left))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk


def file_download_response(
    request: HttpRequest, file: FileRegistration, which: str, *, actor: Actor | None = None
) -> HttpResponseBase:
    """The HTTP answer for the portal and the API alike: 200 (whole), 206 (a range), 404 (no
    such object) or 416; the original plays inline (the audio player), outputs download.
    ``request`` is Django's own (under ASGI the stream must know it); ``actor`` defaults to
    the signed-in person (the API passes ``key:<prefix>`` for a key)."""
    try:
        download = file_download(
            actor=actor or Actor.from_request(request),
            file=file,
            which=which,
            range_header=request.headers.get("Range", ""),
        )
    except ObjectMissing as missing:
        raise Http404(str(missing)) from None
    except RangeNotSatisfiable as unsatisfiable:
        refused = HttpResponse(str(unsatisfiable), status=416, content_type="text/plain")
        refused["Content-Range"] = f"bytes */{unsatisfiable.size}"
        return refused
    response = download_response(
        request, download.chunks, filename=download.filename, content_type=download.content_type
    )
    disposition = "inline" if which == ORIGINAL else "attachment"
    response["Content-Disposition"] = f'{disposition}; filename="{download.filename}"'
    response["Accept-Ranges"] = "bytes"
    response["Content-Length"] = str(download.length)
    if download.range is not None:
        response.status_code = 206
        response["Content-Range"] = (
            f"bytes {download.range.start}-{download.range.end}/{download.size}"
        )
    return response
