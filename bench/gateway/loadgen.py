"""A small HTTP load generator with exact latencies: open loop, and closed loop at one connection.

Open loop: request ``i`` is due at ``start + i / rate`` whatever the answers do, and its
latency is measured from that due time, so time spent waiting for a free connection or for
the generator itself counts against the server, as a real client would feel it. wrk is
closed-loop: a slow answer delays the next request, so a stall hides itself (coordinated
omission).

Closed loop: each connection sends its next request as soon as the last answer is in. It
is used at one connection, where every sample is kept (wrk keeps only a summary), so runs
measured in several slices can be merged exactly.

Kept cheap so that it stays far from being the bottleneck: pre-built request bytes, plain
asyncio protocols, httptools (uvicorn's C parser) for the responses, and a select()-based
event loop, whose timeouts have microsecond resolution where epoll's are milliseconds.
"""

from __future__ import annotations

import asyncio
import collections
import math
import selectors
import time
from dataclasses import dataclass

import httptools

MAX_CONNECTIONS = 512  # select() handles up to 1024 descriptors
DRAIN_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class LoadResult:
    scheduled: int  # open loop: requests due in the measured window
    completed: int
    errors: int
    duration_s: float
    latencies_ms: list[float]  # sorted
    # Sorted; open loop: how late the generator woke up for each request (its own timing
    # error; time then spent waiting for a free connection is the server's, not in here).
    send_lag_ms: list[float]
    connections: int  # the most open at once
    client_cpu_s: float

    def percentile(self, q: float) -> float:
        return percentile(self.latencies_ms, q)

    @property
    def requests_per_s(self) -> float:
        return self.completed / self.duration_s if self.duration_s else 0.0


def merge(results: list[LoadResult]) -> LoadResult:
    return LoadResult(
        scheduled=sum(r.scheduled for r in results),
        completed=sum(r.completed for r in results),
        errors=sum(r.errors for r in results),
        duration_s=sum(r.duration_s for r in results),
        latencies_ms=sorted(x for r in results for x in r.latencies_ms),
        send_lag_ms=sorted(x for r in results for x in r.send_lag_ms),
        connections=max(r.connections for r in results),
        client_cpu_s=sum(r.client_cpu_s for r in results),
    )


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in 0..100)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def build_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, generator: _Generator) -> None:
        self.generator = generator
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.due: float | None = None  # due time of the request in flight, if any

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.generator.connected(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.generator.lost(self)
        if self.due is not None:
            due, self.due = self.due, None
            self.generator.finished(due, ok=False)

    # httptools callback
    def on_message_complete(self) -> None:
        due, self.due = self.due, None
        if due is None:
            return
        keep_alive = self.parser.should_keep_alive()
        self.generator.finished(due, ok=self.parser.get_status_code() == 200)
        if keep_alive:
            self.generator.idle(self)
        elif self.transport is not None:
            self.transport.close()

    def send(self, request: bytes, due: float) -> None:
        assert self.transport is not None
        self.due = due
        self.transport.write(request)


class _Generator:
    def __init__(
        self,
        host: str,
        port: int,
        request: bytes,
        *,
        record_from: float,
        max_connections: int,
        closed_loop: bool,
    ) -> None:
        self.host = host
        self.port = port
        self.request = request
        self.record_from = record_from
        self.max_connections = max_connections
        self.closed_loop = closed_loop
        self.loop = asyncio.get_running_loop()
        self.idle_connections: list[_Connection] = []
        self.connections = 0
        self.peak_connections = 0
        self.opening = 0
        self.waiting: collections.deque[float] = collections.deque()
        self.outstanding = 0
        self.latencies: list[float] = []
        self.send_lag: list[float] = []
        self.errors = 0
        self.completed = 0
        self.all_done = asyncio.Event()
        self.no_more = False

    def due(self, when: float) -> None:
        if when >= self.record_from and not self.closed_loop:
            self.send_lag.append(self.loop.time() - when)
        self.outstanding += 1
        self.waiting.append(when)
        self._dispatch()

    def _dispatch(self) -> None:
        while self.waiting and self.idle_connections:
            self.idle_connections.pop().send(self.request, self.waiting.popleft())
        spare = len(self.waiting) - self.opening
        while spare > 0 and self.connections + self.opening < self.max_connections:
            self.opening += 1
            spare -= 1
            self.loop.create_task(self._open())

    async def _open(self) -> None:
        try:
            await self.loop.create_connection(lambda: _Connection(self), self.host, self.port)
        except OSError:
            self.opening -= 1
            if self.waiting:  # a request that cannot get a connection fails
                self.finished(self.waiting.popleft(), ok=False)

    def connected(self, connection: _Connection) -> None:
        self.opening -= 1
        self.connections += 1
        self.peak_connections = max(self.peak_connections, self.connections)
        self.idle(connection)

    def idle(self, connection: _Connection) -> None:
        self.idle_connections.append(connection)
        self._dispatch()

    def lost(self, connection: _Connection) -> None:
        self.connections -= 1
        if connection in self.idle_connections:
            self.idle_connections.remove(connection)

    def finished(self, due: float, *, ok: bool) -> None:
        now = self.loop.time()
        self.outstanding -= 1
        if due >= self.record_from:
            if ok:
                self.completed += 1
                self.latencies.append(now - due)
            else:
                self.errors += 1
        if self.no_more:
            if self.outstanding == 0:
                self.all_done.set()
        elif self.closed_loop:
            self.due(now)


async def _run(
    host: str,
    port: int,
    request: bytes,
    *,
    rate: float | None,
    connections: int,
    duration_s: float,
    warmup_s: float,
) -> LoadResult:
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.1
    record_from = start + warmup_s
    generator = _Generator(
        host,
        port,
        request,
        record_from=record_from,
        max_connections=connections if rate is None else MAX_CONNECTIONS,
        closed_loop=rate is None,
    )
    if rate is None:
        for _ in range(connections):
            loop.call_at(start, generator.due, start)
    else:
        for i in range(round(rate * (warmup_s + duration_s))):
            loop.call_at(start + i / rate, generator.due, start + i / rate)
    cpu_before = time.process_time()
    await asyncio.sleep(start + warmup_s + duration_s - loop.time())
    generator.no_more = True
    if generator.outstanding:
        try:
            await asyncio.wait_for(generator.all_done.wait(), DRAIN_TIMEOUT_S)
        except TimeoutError:
            generator.errors += generator.outstanding  # never answered: count as failed
    cpu = time.process_time() - cpu_before
    for connection in list(generator.idle_connections):
        if connection.transport is not None:
            connection.transport.close()
    await asyncio.sleep(0)
    return LoadResult(
        scheduled=0 if rate is None else round(rate * duration_s),
        completed=generator.completed,
        errors=generator.errors,
        duration_s=duration_s,
        latencies_ms=sorted(1000 * x for x in generator.latencies),
        send_lag_ms=sorted(1000 * x for x in generator.send_lag),
        connections=generator.peak_connections,
        client_cpu_s=cpu,
    )


def run_load(
    *,
    host: str,
    port: int,
    path: str,
    body: bytes,
    headers: dict[str, str],
    duration_s: float,
    warmup_s: float,
    rate: float | None = None,
    connections: int = 1,
) -> LoadResult:
    """Open loop at ``rate`` requests/s, or closed loop on ``connections`` if no rate is given.

    Runs for ``warmup_s + duration_s``; only requests due after the warm-up are reported.
    """
    request = build_request(host, port, path, body, headers)
    with asyncio.Runner(loop_factory=_select_loop) as runner:
        return runner.run(
            _run(
                host,
                port,
                request,
                rate=rate,
                connections=connections,
                duration_s=duration_s,
                warmup_s=warmup_s,
            )
        )


def _select_loop() -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop(selectors.SelectSelector())
