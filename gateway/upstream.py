"""The fleet client: pooled HTTP/1.1 keep-alive connections to the replicas.

Why not a general HTTP client: measured in the same run (bench/RESULTS.md, "Gateway"), one
aiohttp request cost more CPU than all the gateway's own work for a request. A fleet client
needs little of what a general one offers (no cookies, redirects, proxies, decompression,
or URL normalisation: the replicas are URLs from policy), so this one is a connection pool
and a protocol: the response is parsed by httptools (llhttp, the parser uvicorn uses), the
request head is one formatted string, and a response that arrives in one segment is read
with no further suspension.

Semantics the gateway relies on:

- ``post`` raises ``ReplicaUnreachable`` only when the request provably never reached
  vLLM — the connection was refused or timed out — so another replica may be tried. A
  kept-alive connection that the replica closes at once, before a byte of an answer, lost
  the race with the replica's idle close (it never read the request): that request is sent
  again once, on a fresh connection to the same replica.
- Any other hang-up before or during the answer raises ``UpstreamBroken``: the replica may
  have read the request and worked on it (it died, or an idle timeout cut a non-streaming
  answer, which sends nothing until it is done), so replaying it elsewhere could double the
  work, or take a request that crashes vLLM round the whole fleet. The gateway answers 502.
- Once the head is in, the body is read chunk by chunk as it arrives (``read``); a
  connection lost or an unparsable answer after that raises ``UpstreamBroken``.
- ``close`` always ends the exchange: a connection whose answer was read to the end goes
  back to the pool; any other (the client left, a timeout fired) is aborted, which is how
  vLLM learns to stop generating and free the slot.
- Reading is paused while a response holds more than ``HIGH_WATER`` unread bytes, so a slow
  client slows its replica's stream instead of filling the gateway's memory. Only an idle
  connection that is reading goes back to the pool.
- HTTP/1.1 as a client must read it: interim 1xx answers are skipped (101 is malformed: a
  POST asks for no upgrade), 204 and 304 have no body, a body with neither Content-Length
  nor chunked framing ends with the connection, a transfer coding other than chunked is
  refused (the body is relayed as it comes), and the head is bounded (``MAX_HEAD_BYTES``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import deque
from collections.abc import Sequence
from urllib.parse import urlsplit

import httptools

logger = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024  # an answer head (status line, headers) longer than this is malformed
HIGH_WATER = 256 * 1024  # unread response bytes at which the replica's socket is paused
# Below vLLM's (uvicorn's) default keep-alive of 5 s, so an idle connection is dropped here
# before the replica closes it under a request.
DEFAULT_IDLE_S = 4.0
# A kept-alive connection closed without a byte this soon after the request was written was
# closed by the replica before the request arrived (the close was already on its way): far
# less than any work vLLM does on a request, with room for a busy event loop's lag.
STALE_CLOSE_S = 0.25

Headers = Sequence[tuple[bytes, bytes]]


class UpstreamError(Exception):
    """The replica's answer could not be had or read."""


class ReplicaUnreachable(UpstreamError):
    """The replica did not take the request; nothing reached vLLM, so retrying is safe."""

    def __init__(self, replica: str, reason: str = "") -> None:
        super().__init__(f"{replica}: {reason}" if reason else replica)
        self.replica = replica


class UpstreamBroken(UpstreamError):
    """The replica's answer broke off (connection lost, malformed) after it had begun."""


class UpstreamMalformed(UpstreamBroken):
    """The replica answered something that is not HTTP: it did get the request, so this is
    its failure to report (502), not one to fail over from."""


class _StaleConnection(UpstreamBroken):
    """A kept-alive connection the replica had closed before the request reached it."""


class _Origin:
    """Where a replica's base URL points, parsed once."""

    __slots__ = ("address", "host", "idle", "port", "replica", "ssl")

    def __init__(self, replica: str) -> None:
        parts = urlsplit(replica)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) replica URL: {replica!r}")
        self.replica = replica
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if parts.scheme == "https" else None
        )
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.address = (host if parts.port is None else f"{host}:{parts.port}").encode("idna")
        self.idle: deque[_Connection] = deque()  # newest last


class _Connection(asyncio.Protocol):
    """One keep-alive connection; the exchange on it at most one ``UpstreamResponse``."""

    def __init__(self, pool: Upstream, origin: _Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.response: UpstreamResponse | None = None
        self.reused = False
        self.idle_since = 0.0
        self.written_at = 0.0  # when a reused connection's request went out
        self.closed = False  # counted against the pool's limit until then

    # --- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's does not subclass it

    def data_received(self, data: bytes) -> None:
        if self.response is None:
            # Nothing was asked: a replica talking out of turn is not to be trusted.
            self.abort()
            return
        response = self.response
        try:
            self.parser.feed_data(data)
            if not response.status:
                # Still no final head: bound what it may take (the parser keeps a header
                # whole until it ends), interim answers included.
                response._before_head += len(data)
                if response._before_head > MAX_HEAD_BYTES:
                    raise UpstreamMalformed("the answer's head is too long")
        except (httptools.HttpParserError, UpstreamMalformed) as exc:
            self.abort()
            refusal = exc.__context__ if isinstance(exc, httptools.HttpParserError) else exc
            if not isinstance(refusal, UpstreamMalformed):
                refusal = UpstreamMalformed(f"malformed answer from the replica: {exc}")
            response._fail(refusal)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed()
        response, self.response = self.response, None
        if response is None:
            return
        if (
            self.reused
            and not response._begun
            and time.monotonic() - self.written_at < STALE_CLOSE_S
        ):
            response._fail(_StaleConnection("the replica had closed the idle connection"))
        elif response.status and not response._framed and exc is None:
            response._complete()  # a body delimited by the close of the connection: all there
        else:
            response._lost(exc)

    # --- httptools callbacks ------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.response is None:
            # Another answer right behind the last one, unasked: this parser is mid-message
            # now, so the connection must not be reused.
            self.abort()
        else:
            self.response._begun = True  # a byte of an answer: the replica read the request

    def on_header(self, name: bytes, value: bytes) -> None:
        response = self.response
        if response is None or response.status:
            return  # a chunked body's trailers: not the head's
        response._head_bytes += len(name) + len(value) + 4
        if len(name) == 12 and name.lower() == b"content-type":
            response.content_type = value
        elif len(name) == 14 and name.lower() == b"content-length":
            response.content_length = value
            response._framed = True
        elif len(name) == 17 and name.lower() == b"transfer-encoding":
            if value.strip().lower() != b"chunked":
                # The body is relayed as it comes: a compressed one would reach the client
                # unannounced (the parser would also read it to the close of the connection).
                raise UpstreamMalformed(f"unsupported transfer coding {value!r}")
            response._framed = True

    def on_headers_complete(self) -> None:
        response = self.response
        if response is None:
            return
        status = self.parser.get_status_code()
        if status < 200:
            if status == 101:
                raise UpstreamMalformed("the replica switched protocols on a POST")
            # An interim answer (100 Continue, 103 Early Hints): its headers are not the
            # answer's; the final head follows on the same connection.
            response.content_type = b"application/json"
            response.content_length = None
            response._framed = False
            response._head_bytes = 0
            return
        if response._head_bytes > MAX_HEAD_BYTES:
            raise UpstreamMalformed("the answer's head is too long")
        if status in (204, 304):
            response.content_length = None  # no body, whatever the header says
        response._head(status)

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response._feed(body)

    def on_message_complete(self) -> None:
        response = self.response
        if response is None or not response.status:
            return  # an interim answer's end: the final one follows
        self.response = None
        paused = response._paused
        response._complete()
        if not self.parser.should_keep_alive():
            self.abort()
            return
        if paused and self.transport is not None:
            # The segment that crossed the read-ahead mark also ended the answer: nobody
            # else would resume it, and a paused connection would never hear its next answer.
            self.transport.resume_reading()
        self.pool._idle(self)

    # --- the pool's side ----------------------------------------------------------------
    def abort(self) -> None:
        if not self.closed:
            self._closed()
            if self.transport is not None:
                self.transport.abort()

    def _closed(self) -> None:
        """Once per connection, whichever side closed it first."""
        if not self.closed:
            self.closed = True
            self.pool._forget(self)


class UpstreamResponse:
    """A replica's answer: ``status``, ``content_type`` and ``content_length`` (the header's
    bytes, or None for a chunked stream or a body that ends with the connection) once
    ``post`` returns, then the body through ``read`` until it returns b"" — or until ``done``
    says nothing more will come. Always ``close`` it."""

    __slots__ = (
        "_before_head",
        "_begun",
        "_buffered",
        "_chunks",
        "_connection",
        "_done",
        "_error",
        "_framed",
        "_head_bytes",
        "_head_future",
        "_paused",
        "_waiter",
        "content_length",
        "content_type",
        "status",
    )

    def __init__(self, connection: _Connection, head: asyncio.Future[None]) -> None:
        self._connection: _Connection | None = connection
        self._head_future: asyncio.Future[None] | None = head
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._paused = False
        self._begun = False
        self._framed = False  # Content-Length or chunked; else the body ends with the connection
        self._head_bytes = 0  # the final head's headers, as parsed
        self._before_head = 0  # bytes received while the final head was incomplete
        self._error: UpstreamError | None = None
        self.status = 0
        self.content_type = b"application/json"
        self.content_length: bytes | None = None

    @property
    def done(self) -> bool:
        """Every byte of the body has been read: the next ``read`` would return b""."""
        return self._done and not self._chunks

    async def read(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some); b"" at the end.

        Raises UpstreamBroken when the answer broke off."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunk = self._chunks.popleft() if len(self._chunks) == 1 else self._drain()
        self._buffered = 0
        if self._paused and self._connection is not None:
            self._paused = False
            transport = self._connection.transport
            if transport is not None:
                transport.resume_reading()
        return chunk

    async def peek(self, limit: int) -> bytes:
        """The body's first ``limit`` bytes or more (all of a short answer), left in place for
        ``read``: what the relay looks at in an error before it decides to send it."""
        seen: list[bytes] = []
        size = 0
        while size < limit and (chunk := await self.read()):
            seen.append(chunk)
            size += len(chunk)
        body = b"".join(seen)
        if body:
            self._chunks.appendleft(body)
        return body

    def close(self) -> None:
        """End the exchange: a finished answer's connection is already back in the pool; an
        unfinished one's is aborted (vLLM then stops generating)."""
        connection, self._connection = self._connection, None
        if connection is not None and not self._done:
            connection.response = None
            connection.abort()

    # --- the connection's side ----------------------------------------------------------
    def _drain(self) -> bytes:
        chunks, self._chunks = self._chunks, deque()
        return b"".join(chunks)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _head(self, status: int) -> None:
        self.status = status
        head, self._head_future = self._head_future, None
        if head is not None and not head.done():
            head.set_result(None)

    def _feed(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self._connection is not None:
            transport = self._connection.transport
            if transport is not None:
                self._paused = True
                transport.pause_reading()
        self._wake()

    def _complete(self) -> None:
        self._done = True
        self._connection = None  # the connection goes back to the pool: not ours to close
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if self._done:
            return
        self._error = error
        head, self._head_future = self._head_future, None
        if head is not None and not head.done():
            head.set_exception(error)
            head.exception()  # retrieved here, so no "never retrieved" warning at exit
        self._wake()

    def _lost(self, exc: Exception | None) -> None:
        reason = f": {exc.__class__.__name__}" if exc is not None else ""
        self._fail(UpstreamBroken(f"the replica closed the connection{reason}"))


class Upstream:
    """Keep-alive connections to every replica, at most ``max_connections`` open at once."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        max_connections: int,
        idle_timeout_s: float = DEFAULT_IDLE_S,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._idle_timeout_s = idle_timeout_s
        self._origins: dict[str, _Origin] = {}
        self._open = 0  # connections counted against the limit (connecting, busy or idle)
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    async def start(self) -> None:
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        for origin in self._origins.values():
            while origin.idle:
                origin.idle.pop().abort()

    @property
    def open_connections(self) -> int:
        return self._open

    async def post(
        self, replica: str, path: str, body: bytes, headers: Headers = ()
    ) -> UpstreamResponse:
        """Send ``body`` to ``replica + path``; returns once the answer's head is in.

        Raises ReplicaUnreachable when the request provably never reached vLLM (see the
        module docstring), UpstreamBroken when it may have, UpstreamMalformed when the answer
        is not HTTP. The caller must ``close`` the response.
        """
        origin = self._origins.get(replica)
        if origin is None:
            origin = self._origins[replica] = _Origin(replica)
        request = _request_head(origin, path, len(body), headers) + body
        for fresh in (False, True):
            connection = await self._checkout(origin, fresh=fresh)
            head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            response = UpstreamResponse(connection, head)
            connection.response = response
            transport = connection.transport
            assert transport is not None
            transport.write(request)
            if connection.reused:
                connection.written_at = time.monotonic()
            try:
                await head
            except _StaleConnection:
                # Its other idle connections may be as stale: once more, on a new connection.
                continue
            except UpstreamMalformed:
                raise
            except UpstreamBroken as exc:
                # The replica may have read the request: not to be replayed anywhere.
                logger.warning("upstream_broken_before_answer replica=%s error=%s", replica, exc)
                raise
            except BaseException:
                response.close()  # cancelled while waiting: vLLM must stop on it
                raise
            return response
        raise AssertionError("unreachable: the second attempt is on a fresh connection")

    # --- the pool -----------------------------------------------------------------------
    async def _checkout(self, origin: _Origin, *, fresh: bool = False) -> _Connection:
        """An idle connection to the replica (unless ``fresh``), or a new one."""
        if self._closed:
            raise RuntimeError("Upstream is closed")
        while True:
            connection = None if fresh else self._reuse(origin)
            if connection is not None:
                return connection
            if self._open >= self._max_connections:
                self._evict_idle()
            if self._open < self._max_connections:
                break
            waiter = asyncio.get_running_loop().create_future()
            self._slot_waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    # Woken, then cancelled before it ran: the wake-up is the next waiter's.
                    self._free_slot()
                elif waiter in self._slot_waiters:
                    self._slot_waiters.remove(waiter)
                raise
        self._open += 1
        try:
            return await self._connect(origin)
        except BaseException:
            self._open -= 1
            self._free_slot()
            raise

    def _reuse(self, origin: _Origin) -> _Connection | None:
        """The replica's most recently idle connection that is still good, if any."""
        idle = origin.idle
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            transport = connection.transport
            if (
                now - connection.idle_since < self._idle_timeout_s
                and transport is not None
                and not transport.is_closing()
                and transport.is_reading()  # a paused one would never see its answer
            ):
                connection.reused = True
                return connection
            connection.abort()  # idle too long (the replica may close it any moment) or closing
        return None

    def _evict_idle(self) -> None:
        """At the limit, an idle connection to another replica makes room for this one."""
        oldest: _Connection | None = None
        for other in self._origins.values():
            if other.idle and (oldest is None or other.idle[0].idle_since < oldest.idle_since):
                oldest = other.idle[0]
        if oldest is not None:
            oldest.abort()

    async def _connect(self, origin: _Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self, origin),
                    origin.host,
                    origin.port,
                    ssl=origin.ssl,
                    server_hostname=origin.host if origin.ssl is not None else None,
                )
        except (OSError, TimeoutError) as exc:
            logger.warning(
                "upstream_unreachable replica=%s error=%s", origin.replica, exc.__class__.__name__
            )
            raise ReplicaUnreachable(origin.replica, exc.__class__.__name__) from exc
        return connection

    def _idle(self, connection: _Connection) -> None:
        if self._closed:
            connection.abort()
            return
        connection.idle_since = time.monotonic()
        connection.origin.idle.append(connection)
        if self._slot_waiters:
            # A waiter takes it if it is for the same replica, or evicts it to make room.
            self._free_slot()

    def _forget(self, connection: _Connection) -> None:
        """A connection closed (by either side, once): it no longer counts against the limit."""
        self._open -= 1
        idle = connection.origin.idle
        if idle and connection in idle:
            idle.remove(connection)
        self._free_slot()

    def _free_slot(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def _request_head(origin: _Origin, path: str, length: int, headers: Headers) -> bytes:
    extra = b""
    for name, value in headers:
        if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name:
            raise ValueError(f"header {name!r} holds a line break")
        extra += b"%s: %s\r\n" % (name, value)
    return b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n%s\r\n" % (
        path.encode("latin-1"),
        origin.address,
        length,
        extra,
    )
