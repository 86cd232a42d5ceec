"""One auto-pipelined connection to Valkey for the hot path's Lua calls.

Why not valkey-py's client for these: measured at saturation (bench/RESULTS.md), its async
command path — a pool checkout with an unread-data probe under ``asyncio.timeout``, argument
encoding in Python, a retry wrapper, one socket write and one awaited read per command — cost
more CPU than everything else the gateway does for a request. Here the protocol work is
libvalkey's (its C ``pack_command`` and ``Reader``, the parser valkey-py itself uses) and the
rest is a FIFO:

- every command is packed and queued at once, and all commands queued in one turn of the
  event loop go out in one write (requests in flight share round trips); a command sent
  while nothing is in flight goes out at once;
- replies are matched to their callers in order as they arrive, in ``data_received``, with
  no task or awaited read per command;
- a command is on its way as soon as ``send`` returns, so a caller cancelled afterwards
  (a client gone away) cannot stop it half-way: commands that must happen — a release,
  an abandon — are issued with ``send`` and not awaited.

Failure: a connection that fails, or that leaves a command unanswered for ``reply_timeout_s``
(a hung server), is dropped; every command waiting on it fails with ``valkey.ConnectionError``
(what the callers already treat as "Valkey unavailable"), and the next command reconnects.
Scripts are sent by SHA; a server that does not know one (restarted, flushed) gets the source
once and the command is retried, so no caller ever sees ``NOSCRIPT``.

valkey-py stays the client for everything off the hot path (policy, pub/sub, accounting).

Sentinel and Cluster (runtime/valkey_urls.py, docs/valkey-ha.md): a client made for a Sentinel
URL has the primary's address looked up from the sentinels at every (re)connect, and a
``READONLY`` reply (a demoted primary still reachable) drops the connection so that the next
command reconnects to the new one. A Cluster client gets ``ClusterAutoPipeline``: one
``AutoPipeline`` per primary, each command sent to the primary of its first key's slot, and
a ``MOVED``/``ASK`` reply refreshes the slot map and resends the command once; a node that
cannot be reached (a killed primary) fails its callers and has the slot map re-read in the
background, so that once its replica is promoted the next commands go there.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import libvalkey
import valkey
import valkey.asyncio as avalkey
from valkey.asyncio.cluster import ValkeyCluster
from valkey.asyncio.connection import SSLConnection, UnixDomainSocketConnection
from valkey.asyncio.sentinel import SentinelConnectionPool
from valkey.crc import key_slot

from runtime.valkey_urls import VALKEY_FAILURES

Arg = str | bytes | int | float
# A script call's EVAL form, packed only if the server turns out not to know the SHA: the
# script's source, then its call (numkeys, keys, args) packed, and how many values that is.
_Retry = tuple[bytes, bytes, int]

_NOSCRIPT = "NOSCRIPT"
_READONLY = "READONLY"
_EVAL = b"$4\r\nEVAL\r\n"
_EVALSHA = b"$7\r\nEVALSHA\r\n"


def bulk(value: Arg) -> bytes:
    """One value as RESP packs it (a bulk string), for callers that pre-pack arguments."""
    raw = value if isinstance(value, bytes) else str(value).encode()
    return b"$%d\r\n%s\r\n" % (len(raw), raw)


def pack_values(values: Sequence[Arg]) -> bytes:
    """Values packed back to back, without the array header: a command's part."""
    packed = libvalkey.pack_command(tuple(values))
    return packed[packed.index(b"\r\n") + 2 :]


class _Pending:
    """A command written and not yet answered: who waits, and for a script the EVAL to send
    instead if the server does not know its SHA (packed only then). A batch of plain
    commands is one entry with ``remaining`` replies to collect into ``replies``."""

    __slots__ = ("future", "remaining", "replies", "retry")

    def __init__(
        self,
        future: asyncio.Future[Any],
        retry: _Retry | None,
        batch: int = 0,
    ) -> None:
        self.future = future
        self.retry = retry
        self.remaining = batch
        self.replies: list[Any] | None = [] if batch else None


class _Protocol(asyncio.Protocol):
    def __init__(self, owner: AutoPipeline) -> None:
        self._owner = owner
        self._reader = libvalkey.Reader()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        owner = self._owner
        if owner._protocol is not self:
            return  # a connection given up on: its callers have been failed already
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            owner._answer(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner._lost(self, exc)


class AutoPipeline:
    """Scripts and commands over one connection, pipelined automatically. One per process.

    ``register`` a script's source once; ``await script(name, keys, args)`` runs it and
    returns its reply; ``send_script`` writes it and returns the reply's future without
    waiting (see the module docstring for when that matters).
    """

    def __init__(
        self,
        client: avalkey.Valkey,
        *,
        connect_timeout_s: float = 2.0,
        reply_timeout_s: float = 2.0,
    ) -> None:
        # Where and how to connect, exactly as valkey-py parsed the URL (TCP, TLS or a Unix
        # socket; username, password and database).
        pool = client.connection_pool
        self._connection_class = pool.connection_class
        self._kwargs = dict(pool.connection_kwargs)
        # Sentinel: where the primary is now, asked at every (re)connect.
        self._sentinel = pool if isinstance(pool, SentinelConnectionPool) else None
        self._connect_timeout_s = connect_timeout_s
        self._reply_timeout_s = reply_timeout_s
        # name -> (SHA, source), each packed as a bulk string
        self._scripts: dict[str, tuple[bytes, bytes]] = {}
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None
        self._pending: deque[_Pending] = deque()
        self._outbox: list[bytes] = []
        self._flush_scheduled = False
        self._last_progress = 0.0
        self._watchdog: asyncio.TimerHandle | None = None
        self._closed = False

    # --- the caller's side -----------------------------------------------------------------

    def register(self, name: str, source: str) -> None:
        # SHA-1 because that is how Valkey names scripts (EVALSHA), not for security.
        sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        self._scripts[name] = (bulk(sha), bulk(source))

    async def script(self, name: str, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        return await (await self.send_script(name, keys, args))

    async def send_script(
        self, name: str, keys: Sequence[Arg], args: Sequence[Arg]
    ) -> asyncio.Future[Any]:
        """Write the script's call now; the returned future resolves with its reply.

        Suspends only while (re)connecting: once it returns, the command is on its way."""
        call = (len(keys), *keys, *args)
        key = _as_bytes(keys[0]) if keys else None
        return await self.send_packed_script(name, pack_values(call), len(call), key=key)

    async def send_packed_script(
        self, name: str, call: bytes, count: int, *, key: bytes | None = None
    ) -> asyncio.Future[Any]:
        """``send_script`` for a caller that packed the call itself: numkeys, the keys and the
        args, ``count`` values in all, packed back to back (``pack_values``, ``bulk``).
        ``key``: the call's first key, where the caller has it at hand (a Cluster routes by
        it; one server ignores it)."""
        sha, source = self._scripts[name]
        command = b"*%d\r\n%s%s%s" % (count + 2, _EVALSHA, sha, call)
        return await self._send(command, (source, call, count))

    async def execute(self, *args: Arg) -> Any:
        """One plain command (not a script), pipelined with the rest."""
        return await (await self._send(libvalkey.pack_command(args), None))

    async def execute_many(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """Plain commands in one go; each one's reply, or the ResponseError it got.

        One write and one waiter for the lot (the accounting streams send hundreds at a
        time). Raises (valkey.ConnectionError) only when the connection failed."""
        packed = b"".join([libvalkey.pack_command(tuple(c)) for c in commands])
        return await self.execute_packed(packed, len(commands))

    async def execute_packed(
        self, commands: bytes, count: int, *, replicas: int = 0, replica_timeout_ms: int = 100
    ) -> list[Any]:
        """``execute_many`` for a caller that packed its ``count`` commands itself (RESP
        arrays back to back, as ``libvalkey.pack_command`` or ``bulk`` make them).

        ``replicas``: return only once that many replicas have the writes (``WAIT``, sent in
        the same write; repeated while fewer acknowledge). WAIT blocks the connection it is
        sent on, so give such writes their own pipeline, not the hot path's."""
        if not count:
            return []
        if replicas:
            commands += libvalkey.pack_command(("WAIT", replicas, replica_timeout_ms))
        replies: list[Any] = await (await self._send(commands, None, batch=count + bool(replicas)))
        if replicas:
            acknowledged = replies.pop()
            while True:
                if isinstance(acknowledged, Exception):
                    raise acknowledged
                if int(acknowledged) >= replicas:
                    break
                acknowledged = await self.execute("WAIT", replicas, replica_timeout_ms)
        return replies

    async def node_for(self, key: bytes) -> AutoPipeline:
        """The pipeline whose connection carries commands on ``key``: this one, on one server
        (a WAIT must follow the writes it stands for on their own connection)."""
        return self

    async def close(self) -> None:
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()
        self._fail_all(valkey.ConnectionError("The connection to Valkey was closed."))

    # --- internals --------------------------------------------------------------------------

    async def _send(
        self, command: bytes, retry: _Retry | None, batch: int = 0
    ) -> asyncio.Future[Any]:
        while self._protocol is None:  # (connected, then lost before this task resumed)
            await self._connect()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        idle = not self._pending
        if idle:
            self._last_progress = loop.time()
        self._pending.append(_Pending(future, retry, batch))
        protocol = self._protocol
        if idle and not self._outbox and protocol is not None and protocol.transport is not None:
            # Nothing in flight: no one to share a write with, so do not wait a loop turn.
            protocol.transport.write(command)
            return future
        self._outbox.append(command)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        outbox, self._outbox = self._outbox, []
        protocol = self._protocol
        if protocol is None or protocol.transport is None:
            # Lost between queueing and this turn: _lost failed the waiters already.
            return
        protocol.transport.writelines(outbox)

    def _answer(self, reply: Any) -> None:
        if not self._pending:
            return  # nothing asked for it (the waiters failed already): ignore
        entry = self._pending[0]
        self._last_progress = asyncio.get_running_loop().time()
        if entry.replies is not None:
            # One reply of a batch: answered once all of them are in.
            if isinstance(reply, libvalkey.ReplyError) and str(reply).startswith(_READONLY):
                self._demoted()
            entry.replies.append(
                valkey.ResponseError(str(reply))
                if isinstance(reply, libvalkey.ReplyError)
                else reply
            )
            entry.remaining -= 1
            if entry.remaining == 0:
                self._pending.popleft()
                if not entry.future.done():
                    entry.future.set_result(entry.replies)
            return
        self._pending.popleft()
        if isinstance(reply, libvalkey.ReplyError):
            message = str(reply)
            if message.startswith(_NOSCRIPT) and entry.retry is not None:
                # The server lost its script cache: send the source, in the same order slot
                # at the end of the queue, and answer this caller from that.
                self._pending.append(_Pending(entry.future, None))
                source, call, count = entry.retry
                self._outbox.append(b"*%d\r\n%s%s%s" % (count + 2, _EVAL, source, call))
                self._flush()
                return
            if message.startswith(_READONLY):
                self._demoted()
            if not entry.future.done():
                entry.future.set_exception(valkey.ResponseError(message))
            return
        if not entry.future.done():
            entry.future.set_result(reply)

    def _demoted(self) -> None:
        """A primary demoted by a failover answers READONLY: reconnect (via Sentinel, to the
        new one). The replies already on their way still reach their callers first."""
        protocol = self._protocol
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()

    def _lost(self, protocol: _Protocol, exc: Exception | None) -> None:
        if protocol is not self._protocol:
            return
        self._protocol = None
        reason = f": {exc}" if exc else ""
        self._fail_all(valkey.ConnectionError(f"The connection to Valkey was lost{reason}."))

    def _fail_all(self, error: Exception) -> None:
        pending, self._pending = self._pending, deque()
        self._outbox = []
        for entry in pending:
            if not entry.future.done():
                entry.future.set_exception(error)
                # Fire-and-forget callers may never look: do not warn about it at exit.
                entry.future.exception()

    async def _connect(self) -> None:
        if self._closed:
            raise valkey.ConnectionError("The Valkey connection is closed.")
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
        connecting = self._connecting
        try:
            # _open sets self._protocol itself: a waiter resuming late must not put back a
            # connection that has been lost (and replaced) since.
            await asyncio.shield(connecting)
        finally:
            # Only this attempt's own slot: a waiter resuming after a failed attempt must not
            # clear the next attempt's, or two connections would be opened at once and their
            # replies answer each other's callers.
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        kwargs = self._kwargs
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                if issubclass(self._connection_class, UnixDomainSocketConnection):
                    _, protocol = await loop.create_unix_connection(
                        lambda: _Protocol(self), kwargs["path"]
                    )
                else:
                    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
                    if self._sentinel is not None:
                        host, port = await self._sentinel.get_master_address()  # type: ignore[no-untyped-call]
                    _, protocol = await loop.create_connection(
                        lambda: _Protocol(self), host, int(port), ssl=self._ssl_context()
                    )
        except (OSError, TimeoutError, valkey.ValkeyError) as exc:
            # (valkey.ValkeyError: no sentinel knows a primary, e.g. mid-failover)
            raise valkey.ConnectionError(f"Cannot connect to Valkey: {exc!r}") from exc
        # Until the handshake is answered nobody else may use the connection: queue it first.
        self._protocol = protocol
        handshake: list[asyncio.Future[Any]] = []
        password = kwargs.get("password")
        if password:
            username = kwargs.get("username")
            auth = ("AUTH", username, password) if username else ("AUTH", password)
            handshake.append(await self._send(libvalkey.pack_command(auth), None))
        if int(kwargs.get("db") or 0):
            handshake.append(
                await self._send(libvalkey.pack_command(("SELECT", kwargs["db"])), None)
            )
        try:
            for reply in handshake:
                await reply
        except valkey.ValkeyError as exc:
            self._lost(protocol, exc)  # fails whatever was queued behind the handshake
            assert protocol.transport is not None
            protocol.transport.close()
            raise
        self._arm_watchdog()
        return protocol

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not issubclass(self._connection_class, SSLConnection):
            return None
        tls_options = {k: v for k, v in self._kwargs.items() if k.startswith("ssl_")}
        context: ssl.SSLContext = SSLConnection(**tls_options).ssl_context.get()
        return context

    def _arm_watchdog(self) -> None:
        if self._watchdog is not None or self._closed:
            return
        loop = asyncio.get_running_loop()
        interval = max(0.05, self._reply_timeout_s / 4)

        def check() -> None:
            self._watchdog = None
            protocol = self._protocol
            if (
                protocol is not None
                and self._pending
                and loop.time() - self._last_progress > self._reply_timeout_s
            ):
                # A server that accepts commands but never answers: give up on it, so that
                # callers fail over to "unavailable" instead of hanging.
                self._lost(protocol, TimeoutError(f"no reply in {self._reply_timeout_s:g} s"))
                if protocol.transport is not None:
                    protocol.transport.abort()
            if not self._closed:
                self._watchdog = loop.call_later(interval, check)

        self._watchdog = loop.call_later(interval, check)


_REDIRECT = ("MOVED", "ASK")
_REFRESH_S = 0.2
# What reading the slot map or finding a slot's node raises while a failover is under way:
# valkey-py's ValkeyClusterException (slots not covered, nodes that disagree) is no
# ValkeyError, and escaping as it is it would end the caller's loop (the reaper's) for good;
# IndexError: no primary known at all.
_UNREACHABLE: tuple[type[BaseException], ...] = (*VALKEY_FAILURES, IndexError)


def _as_bytes(value: Arg) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode()


def _first_values(command: bytes, start: int) -> tuple[list[bytes], int]:
    """The first three values of the RESP array at ``start`` (all of them if fewer), and
    where the next array begins: enough to find a packed command's key."""
    end = command.index(b"\r\n", start)
    count = int(command[start + 1 : end])
    position, values = end + 2, list[bytes]()
    for _ in range(count):
        end = command.index(b"\r\n", position)
        length = int(command[position + 1 : end])
        if len(values) < 3:
            values.append(command[end + 2 : end + 2 + length])
        position = end + 2 + length + 2
    return values, position


def _key_of(values: Sequence[bytes]) -> bytes | None:
    """The key a plain command acts on (the commands the gateway pipelines: XADD, XLEN,
    HGETALL, ZADD, … take it first; XINFO after its subcommand; TIME has none)."""
    if len(values) < 2:
        return None
    if values[0].upper() in (b"XINFO", b"OBJECT", b"MEMORY") and len(values) > 2:
        return values[2]
    return values[1]


class ClusterAutoPipeline(AutoPipeline):
    """``AutoPipeline`` for a Valkey Cluster: one per primary, by the first key's slot.

    A script's keys must share a slot (Valkey refuses the call otherwise, CROSSSLOT); a
    batch of plain commands is split by slot and its replies put back in order."""

    def __init__(
        self,
        client: avalkey.Valkey,
        *,
        connect_timeout_s: float = 2.0,
        reply_timeout_s: float = 2.0,
    ) -> None:
        self._cluster = cast(Any, client)  # valkey.asyncio.cluster.ValkeyCluster
        self._connect_timeout_s = connect_timeout_s
        self._reply_timeout_s = reply_timeout_s
        self._scripts: dict[str, tuple[bytes, bytes]] = {}
        self._nodes: dict[str, AutoPipeline] = {}
        self._ready = False
        self._closed = False
        # A node that cannot be reached may have failed over: the slot map is read again
        # (from any live node), at most one read at a time, at most every _REFRESH_S.
        self._refreshing: asyncio.Future[None] | None = None
        self._refreshed_at = -_REFRESH_S

    def register(self, name: str, source: str) -> None:
        super().register(name, source)
        for pipe in self._nodes.values():
            pipe.register(name, source)

    async def _pipe_for(self, key: bytes | None) -> AutoPipeline:
        if self._closed:
            raise valkey.ConnectionError("The Valkey connection is closed.")
        try:
            if not self._ready:
                await self._cluster.initialize()
                self._ready = True
            manager = self._cluster.nodes_manager
            if key is None:
                # (valkey-py drops its default node when its client fails to re-initialise;
                # its NodesManager has no get_random_node: the AttributeError that was
                # called here ended the caller's loop, the reaper's, for good)
                node = (
                    self._cluster.get_default_node()
                    or manager.get_nodes_by_server_type("primary")[0]
                )
            else:
                node = manager.get_node_from_slot(key_slot(key))
        except _UNREACHABLE as exc:
            raise valkey.ConnectionError(f"Cannot reach the Valkey Cluster: {exc!r}") from exc
        pipe = self._nodes.get(node.name)
        if pipe is None:
            kwargs = self._cluster.connection_kwargs
            pipe = AutoPipeline(
                avalkey.Valkey(
                    host=node.host,
                    port=node.port,
                    username=kwargs.get("username"),
                    password=kwargs.get("password"),
                ),
                connect_timeout_s=self._connect_timeout_s,
                reply_timeout_s=self._reply_timeout_s,
            )
            pipe._scripts = dict(self._scripts)
            self._nodes[node.name] = pipe
        return pipe

    async def node_for(self, key: bytes) -> AutoPipeline:
        """The pipeline of the primary that owns ``key``'s slot."""
        return await self._pipe_for(key)

    async def _refresh(self) -> None:
        """The slot map moved (a reshard or a failover): read it again."""
        try:
            await self._cluster.nodes_manager.initialize()
        except _UNREACHABLE as exc:
            raise valkey.ConnectionError(f"Cannot reach the Valkey Cluster: {exc!r}") from exc

    def _unreachable(self) -> None:
        """A node's connection failed (refused, reset, no reply): its replica may be taking
        over. Re-read the slot map in the background, so that the commands after this one
        go to the new primary; the callers of this one fail ("Valkey unavailable"). Until
        the replica is promoted the map still names the dead node: the next failure reads
        it again."""
        loop = asyncio.get_running_loop()
        if self._closed or self._refreshing is not None:
            return
        if loop.time() - self._refreshed_at < _REFRESH_S:
            return
        self._refreshed_at = loop.time()

        async def refresh() -> None:
            try:
                await self._refresh()
            except valkey.ConnectionError:
                pass  # every node listed is away: the next failure tries again
            finally:
                self._refreshing = None

        self._refreshing = asyncio.ensure_future(refresh())

    async def send_packed_script(
        self, name: str, call: bytes, count: int, *, key: bytes | None = None
    ) -> asyncio.Future[Any]:
        if key is None:
            # call: numkeys, then the keys: the first key is the second value (parsing it
            # costs the gateway several per cent of its CPU: callers pass ``key``).
            values, _ = _first_values(b"*%d\r\n" % count + call, 0)
            key = values[1] if len(values) > 1 and values[0] != b"0" else None
        try:
            first = await (await self._pipe_for(key)).send_packed_script(name, call, count)
        except valkey.ConnectionError:
            self._unreachable()
            raise

        async def redirected() -> Any:
            try:
                return await first
            except valkey.ResponseError as exc:
                if not str(exc).startswith(_REDIRECT):
                    raise
            except valkey.ConnectionError:
                self._unreachable()
                raise
            await self._refresh()
            return await (await (await self._pipe_for(key)).send_packed_script(name, call, count))

        return asyncio.ensure_future(redirected())

    async def execute(self, *args: Arg) -> Any:
        packed = libvalkey.pack_command(args)
        replies = await self.execute_packed(packed, 1)
        if isinstance(replies[0], valkey.ResponseError):
            raise replies[0]
        return replies[0]

    async def execute_packed(
        self, commands: bytes, count: int, *, replicas: int = 0, replica_timeout_ms: int = 100
    ) -> list[Any]:
        spans: list[tuple[bytes | None, bytes]] = []
        start = 0
        for _ in range(count):
            values, end = _first_values(commands, start)
            spans.append((_key_of(values), commands[start:end]))
            start = end
        replies: list[Any] = [None] * count
        todo = list(range(count))
        for attempt in range(2):
            groups: dict[int, tuple[AutoPipeline, list[int]]] = {}
            for index in todo:
                pipe = await self._pipe_for(spans[index][0])
                groups.setdefault(id(pipe), (pipe, []))[1].append(index)
            sent = [
                (
                    indices,
                    pipe.execute_packed(
                        b"".join(spans[i][1] for i in indices),
                        len(indices),
                        replicas=replicas,
                        replica_timeout_ms=replica_timeout_ms,
                    ),
                )
                for pipe, indices in groups.values()
            ]
            try:
                for indices, answer in sent:
                    for index, reply in zip(indices, await answer, strict=True):
                        replies[index] = reply
            except valkey.ConnectionError:
                self._unreachable()
                for _, answer in sent:
                    answer.close()  # (those not sent: a coroutine never awaited warns)
                raise
            todo = [
                i
                for i in todo
                if isinstance(replies[i], valkey.ResponseError)
                and str(replies[i]).startswith(_REDIRECT)
            ]
            if not todo or attempt:
                break
            await self._refresh()
        return replies

    async def close(self) -> None:
        self._closed = True
        for pipe in self._nodes.values():
            await pipe.close()


def auto_pipeline(client: avalkey.Valkey, **kwargs: Any) -> AutoPipeline:
    """The hot path's pipeline for ``client``, whatever its topology (runtime/valkey_urls.py)."""
    if isinstance(client, ValkeyCluster):
        return ClusterAutoPipeline(client, **kwargs)
    return AutoPipeline(client, **kwargs)
