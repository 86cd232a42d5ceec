"""Request bodies in S3's payload modes, streamed and checked before the last byte goes on.

- a hex ``x-amz-content-sha256``: the body's hash must equal it;
- ``UNSIGNED-PAYLOAD``: the body as is (presigned URLs, TLS clients);
- ``aws-chunked`` bodies: ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD`` (each chunk signed, chained
  from the request's signature) and ``STREAMING-UNSIGNED-PAYLOAD-TRAILER`` (a checksum in a
  trailer, what current boto3 and the aws CLI send by default).

Hashing (SHA-256, a trailer's CRC) runs on the event loop, a piece at a time: at several
hundred MB/s a core it costs less than a thread hop per piece would (bench/files/).

The decoded body is handed on one piece behind (``hold_back_last``): a check that fails at
the end raises before the final piece is sent, so the backing store never completes an
object whose body was wrong — the upload fails with a short body instead.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.httpchecksum import _CHECKSUM_CLS

from s3endpoint.errors import S3Error
from s3endpoint.sigv4 import ChunkChain

UNSIGNED = "UNSIGNED-PAYLOAD"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
STREAMING_MODES = frozenset({STREAMING_SIGNED, STREAMING_UNSIGNED_TRAILER})
_HEX_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MAX_LINE = 4096  # a chunk header or a trailer line; real ones are under 200 bytes
_MAX_TRAILERS = 16 * 1024

Receive = Callable[[], Awaitable[dict[str, Any]]]


class ClientGone(Exception):
    """The client disconnected mid-body."""


def payload_mode(declared: str | None) -> str:
    """Validate ``x-amz-content-sha256``: a hex hash, or one of the modes we decode."""
    if declared is None:
        raise S3Error("InvalidRequest", "Missing required header x-amz-content-sha256.")
    if declared in (UNSIGNED, *STREAMING_MODES) or _HEX_SHA256.match(declared):
        return declared
    if declared.startswith("STREAMING-"):
        raise S3Error("NotImplemented", f"The payload mode {declared} is not supported.")
    raise S3Error("InvalidArgument", "x-amz-content-sha256 must be a hex SHA-256 or a mode.")


@dataclass
class AwsChunkedDecoder:
    """Incremental ``aws-chunked`` decoder: ``feed`` bytes split anywhere, get payload bytes.

    ``<hex size>[;chunk-signature=<sig>]\\r\\n<data>\\r\\n`` … ``0[;chunk-signature=…]\\r\\n``,
    then trailer lines ``name:value\\r\\n`` and an empty line. Each chunk's signature (if the
    body is signed) is checked against ``chain`` once its data is complete."""

    chain: ChunkChain | None = None
    trailers: dict[str, str] = field(default_factory=dict)
    done: bool = False
    _buffer: bytearray = field(default_factory=bytearray)
    _remaining: int = -1  # data bytes left in the current chunk; -1: a size line is next
    _signature: str | None = None
    _chunk_hash: Any = None
    _in_trailers: bool = False
    _need_crlf: bool = False
    _trailer_bytes: int = 0

    def feed(self, data: bytes) -> list[bytes]:
        if self.done and data:
            raise S3Error("IncompleteBody", "Bytes after the end of the aws-chunked body.")
        self._buffer += data
        out: list[bytes] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> None:
        if not self.done:
            raise S3Error("IncompleteBody", "The aws-chunked body ended before its last chunk.")

    def _line(self) -> str | None:
        end = self._buffer.find(b"\r\n")
        if end < 0:
            if len(self._buffer) > _MAX_LINE:
                raise S3Error("InvalidRequest", "An aws-chunked line is too long.")
            return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 2]
        return line.decode("latin-1")

    def _step(self, out: list[bytes]) -> bool:
        if self.done:
            return False
        if self._need_crlf:
            if len(self._buffer) < 2:
                return False
            if self._buffer[:2] != b"\r\n":
                raise S3Error("InvalidRequest", "An aws-chunked chunk does not end in CRLF.")
            del self._buffer[:2]
            self._need_crlf = False
            self._end_chunk()
            return True
        if self._in_trailers:
            return self._trailer_line()
        if self._remaining > 0:
            if not self._buffer:
                return False
            take = bytes(self._buffer[: self._remaining])
            del self._buffer[: len(take)]
            self._remaining -= len(take)
            if self._chunk_hash is not None:
                self._chunk_hash.update(take)
            out.append(take)
            if self._remaining == 0:
                self._need_crlf = True
            return True
        line = self._line()
        if line is None:
            return False
        size_text, _, extension = line.partition(";")
        try:
            size = int(size_text, 16)
        except ValueError as exc:
            raise S3Error("InvalidRequest", "An aws-chunked chunk size is not hex.") from exc
        self._signature = None
        if extension:
            name, _, value = extension.partition("=")
            if name.strip() == "chunk-signature":
                self._signature = value.strip()
        if self.chain is not None and self._signature is None:
            raise S3Error("SignatureDoesNotMatch", "A signed aws-chunked chunk has no signature.")
        self._chunk_hash = hashlib.sha256() if self.chain is not None else None
        if size == 0:
            self._end_chunk()
            self._in_trailers = True
            return True
        self._remaining = size
        return True

    def _end_chunk(self) -> None:
        if self.chain is not None:
            assert self._signature is not None
            assert self._chunk_hash is not None
            self.chain.verify(self._chunk_hash.hexdigest(), self._signature)
        self._remaining = -1

    def _trailer_line(self) -> bool:
        line = self._line()
        if line is None:
            return False
        self._trailer_bytes += len(line) + 2
        if self._trailer_bytes > _MAX_TRAILERS:
            raise S3Error("InvalidRequest", "The aws-chunked trailers are too long.")
        if line == "":
            self.done = True
            return False
        name, sep, value = line.partition(":")
        if not sep:
            raise S3Error("InvalidRequest", "An aws-chunked trailer is not name:value.")
        self.trailers[name.strip().lower()] = value.strip()
        return True


@dataclass
class BodyCheck:
    """What a finished body is checked against, and what it turned out to be."""

    mode: str
    expected_length: int
    declared_trailer: str | None = None  # x-amz-trailer, e.g. x-amz-checksum-crc32
    chain: ChunkChain | None = None
    max_piece: int = 1024 * 1024
    sha256: str = ""
    length: int = 0
    trailers: dict[str, str] = field(default_factory=dict)


def _checksum_of(trailer: str) -> Any:
    algorithm = trailer.removeprefix("x-amz-checksum-")
    cls = _CHECKSUM_CLS.get(algorithm)
    if trailer == algorithm or cls is None:
        raise S3Error("InvalidRequest", f"The trailer {trailer!r} is not a checksum we verify.")
    return cls()


async def decoded_body(receive: Receive, check: BodyCheck) -> AsyncIterator[bytes]:
    """The payload, decoded; raises S3Error at the end if any check fails."""
    digest = hashlib.sha256()
    streaming = check.mode in STREAMING_MODES
    decoder = AwsChunkedDecoder(chain=check.chain) if streaming else None
    checksum = _checksum_of(check.declared_trailer) if check.declared_trailer else None
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        data: bytes = message.get("body", b"")
        pieces = decoder.feed(data) if decoder is not None else ([data] if data else [])
        for piece in pieces:
            check.length += len(piece)
            if check.length > check.expected_length:
                raise S3Error("IncompleteBody", "The body is longer than its declared length.")
            digest.update(piece)
            if checksum is not None:
                checksum.update(piece)
            yield piece
        if not message.get("more_body", False):
            break
    if decoder is not None:
        decoder.finish()
        check.trailers = decoder.trailers
    if check.length != check.expected_length:
        raise S3Error("IncompleteBody", "The body is shorter than its declared length.")
    check.sha256 = digest.hexdigest()
    if _HEX_SHA256.match(check.mode) and check.sha256 != check.mode:
        raise S3Error(
            "XAmzContentSHA256Mismatch",
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
        )
    if checksum is not None and check.declared_trailer is not None:
        sent = check.trailers.get(check.declared_trailer)
        if sent is None:
            raise S3Error("InvalidRequest", f"The trailer {check.declared_trailer} is missing.")
        if base64.b64decode(sent) != base64.b64decode(checksum.b64digest()):
            raise S3Error("BadDigest", f"The {check.declared_trailer} does not match the body.")


async def hold_back_last(
    pieces: AsyncIterator[bytes], coalesce: int = 512 * 1024
) -> AsyncIterator[bytes]:
    """Pass pieces on one behind, so the source's final checks run before the last one; small
    pieces (the server hands over ~64 KiB at a time) are joined up to ``coalesce`` bytes, so
    the upstream write costs one call per half MiB, not per network read."""
    pending: list[bytes] = []
    size = 0
    async for piece in pieces:
        pending.append(piece)
        size += len(piece)
        if size >= coalesce * 2:
            # Keep the newest piece back: the check at the end must run before it goes.
            *ready, newest = pending
            yield b"".join(ready)
            pending, size = [newest], len(newest)
    if pending:
        yield b"".join(pending)
