"""The fleet client (gateway/upstream.py) against real HTTP servers on loopback.

Each test scripts a small replica — a real asyncio server on a real socket — to answer the
way a vLLM replica can: keep-alive, closing idle connections, chunked streams, refusing,
hanging up, talking nonsense. The gateway-level behaviours built on these (failover, 504,
cut streams, a client leaving) are in test_failures.py against the simulator.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
import uvloop

from gateway.upstream import (
    HIGH_WATER,
    MAX_HEAD_BYTES,
    ReplicaUnreachable,
    Upstream,
    UpstreamBroken,
    UpstreamMalformed,
    UpstreamResponse,
)
from ops.processes import free_port

JSON_HEADERS = ((b"content-type", b"application/json"),)
# (reader, writer, request head, request body) -> keep the connection open afterwards?
Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes, bytes], Awaitable[bool]]


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    """On uvloop, as the gateway runs; bounded so that a hang fails instead of stalling."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(asyncio.wait_for(coroutine, 20))


def plain(body: bytes, *, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
        % (len(body), extra, body)
    )


async def answer_ok(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes, body: bytes
) -> bool:
    writer.write(plain(b'{"echo":' + body + b"}"))
    await writer.drain()
    return True


class Replica:
    """A real HTTP/1.1 server on loopback whose answers the test scripts."""

    def __init__(self, answer: Answer = answer_ok) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.hangups = 0  # connections that ended, from either side
        self.hung_up = asyncio.Event()
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Replica:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                found = re.search(rb"(?i)content-length: *(\d+)", head)
                body = await reader.readexactly(int(found.group(1))) if found else b""
                self.requests.append((head, body))
                if not await self.answer(reader, writer, head, body):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.hangups += 1
            self.hung_up.set()


async def read_all(response: UpstreamResponse) -> bytes:
    try:
        chunks = []
        while chunk := await response.read():
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        response.close()


def upstream(**overrides: Any) -> Upstream:
    settings: dict[str, Any] = {"connect_timeout_s": 2.0, "max_connections": 100}
    settings.update(overrides)
    return Upstream(**settings)


def test_answers_come_back_and_one_connection_carries_them_all():
    async def scenario() -> None:
        async with Replica() as replica:
            client = upstream()
            for n in range(5):
                response = await client.post(
                    replica.url, "/v1/chat/completions", b"%d" % n, JSON_HEADERS
                )
                assert (response.status, response.content_type) == (200, b"application/json")
                assert response.content_length == b"10"
                assert await read_all(response) == b'{"echo":%d}' % n
            assert replica.connections == 1
            head, body = replica.requests[0]
            assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            assert b"\r\ncontent-type: application/json\r\n" in head
            assert b"\r\nHost: " + replica.url.removeprefix("http://").encode() in head
            assert body == b"0"
            await client.close()

    run(scenario())


def test_a_connection_the_replica_closed_while_idle_is_replaced_not_failed_over():
    """GIVEN a replica that closes every connection right after answering, without saying so
    WHEN the next request finds that connection in the pool
    THEN it goes out again on a fresh connection: the race is not the replica's failure."""

    async def answer_then_hang_up(reader, writer, head, body) -> bool:
        writer.write(plain(b"{}"))
        await writer.drain()
        return False

    async def scenario() -> None:
        async with Replica(answer_then_hang_up) as replica:
            client = upstream()
            for _ in range(4):
                assert await read_all(await client.post(replica.url, "/x", b"{}")) == b"{}"
                await asyncio.sleep(0.05)  # the hang-up reaches the client, or not: both ways
            assert replica.connections == 4
            await client.close()

    run(scenario())


def test_when_every_idle_connection_is_stale_the_retry_is_on_a_new_one():
    """GIVEN two idle connections to a replica that has dropped them both (it hangs up on a
    second request on any connection, as after a restart behind the same address)
    WHEN a request takes one of them
    THEN it is sent again on a new connection, not on the other stale one, and answered."""
    both_in = asyncio.Event()
    answered_on: set[asyncio.StreamWriter] = set()

    async def first_only(reader, writer, head, body) -> bool:
        if writer in answered_on:
            return False  # a request on a kept-alive connection: hang up unanswered
        answered_on.add(writer)
        if len(answered_on) == 2:
            both_in.set()
        await both_in.wait()  # hold the first two, so that the client opens two connections
        writer.write(plain(body))
        await writer.drain()
        return True

    async def scenario() -> None:
        async with Replica(first_only) as replica:
            client = upstream()
            answers = await asyncio.gather(
                *(client.post(replica.url, "/x", b"%d" % n) for n in range(2))
            )
            assert sorted([await read_all(a) for a in answers]) == [b"0", b"1"]
            assert replica.connections == 2
            # Both connections are idle in the pool now; the replica will drop each.
            answered = await client.post(replica.url, "/x", b"again")
            assert answered.status == 200
            assert replica.connections == 3
            await read_all(answered)
            await client.close()

    run(scenario())


def test_an_idle_connection_older_than_the_idle_timeout_is_not_reused():
    async def scenario() -> None:
        async with Replica() as replica:
            client = upstream(idle_timeout_s=0.1)
            await read_all(await client.post(replica.url, "/x", b"1"))
            await asyncio.sleep(0.2)
            await read_all(await client.post(replica.url, "/x", b"2"))
            assert replica.connections == 2
            await asyncio.wait_for(replica.hung_up.wait(), 2)  # the old one was closed
            await client.close()

    run(scenario())


def test_a_replica_that_refuses_the_connection_is_unreachable():
    async def scenario() -> None:
        client = upstream()
        nobody = f"http://127.0.0.1:{free_port()}"
        with pytest.raises(ReplicaUnreachable) as refused:
            await client.post(nobody, "/x", b"{}")
        assert refused.value.replica == nobody
        assert client.open_connections == 0
        await client.close()

    run(scenario())


def test_a_replica_that_read_the_request_and_hung_up_is_broken_not_unreachable():
    """GIVEN a replica that reads the whole request on a new connection, then hangs up
    WHEN the client waits for its answer
    THEN it is UpstreamBroken, never ReplicaUnreachable: vLLM may have worked on it, so it
    must not be replayed on another replica (nor on this one)."""

    async def hang_up(reader, writer, head, body) -> bool:
        return False

    async def scenario() -> None:
        client = upstream()
        async with Replica(hang_up) as replica:
            with pytest.raises(UpstreamBroken):
                await client.post(replica.url, "/x", b"{}")
            assert len(replica.requests) == 1
        assert client.open_connections == 0
        await client.close()

    run(scenario())


def test_a_kept_alive_replica_dying_while_working_on_a_request_is_not_replayed():
    """GIVEN a kept-alive connection to a replica that answered once
    WHEN the replica reads the next request, works on it for a while and dies without a byte
    (or an idle timeout cuts a non-streaming answer that sends nothing until done)
    THEN the request is UpstreamBroken and was sent once: no retry on a fresh connection."""

    async def once_then_die(reader, writer, head, body) -> bool:
        if body == b"first":
            writer.write(plain(body))
            await writer.drain()
            return True
        await asyncio.sleep(0.3)  # generating, as far as the client can tell
        return False

    async def scenario() -> None:
        async with Replica(once_then_die) as replica:
            client = upstream()
            assert await read_all(await client.post(replica.url, "/x", b"first")) == b"first"
            with pytest.raises(UpstreamBroken):
                await client.post(replica.url, "/x", b"second")
            assert [body for _, body in replica.requests] == [b"first", b"second"]
            assert replica.connections == 1
            await client.close()

    run(scenario())


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b"SMTP ready\r\n\r\n", id="not-http"),
        # A protocol switch on a POST: the bytes after it would not be HTTP.
        pytest.param(
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n",
            id="switching-protocols",
        ),
        # The body is relayed as it comes: a gzip transfer coding would reach the client still
        # compressed and unannounced, so it is refused (as h11 refuses it).
        pytest.param(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            id="gzip-transfer-coding",
        ),
    ],
)
def test_a_malformed_answer_is_reported_and_its_connection_dropped(answer: bytes):
    """The replica got the request and answered something the gateway cannot relay: a 502
    (UpstreamMalformed, never a failover), and the connection is hung up, not pooled."""

    async def malformed(reader, writer, head, body) -> bool:
        writer.write(answer)
        await writer.drain()
        await reader.read()  # until the client hangs up
        return False

    async def scenario() -> None:
        async with Replica(malformed) as replica:
            client = upstream()
            with pytest.raises(UpstreamMalformed):
                await client.post(replica.url, "/x", b"{}")
            await asyncio.wait_for(replica.hung_up.wait(), 2)
            assert client.open_connections == 0
            await client.close()

    run(scenario())


def test_a_stream_is_read_chunk_by_chunk_as_it_arrives():
    more = asyncio.Event()

    async def stream(reader, writer, head, body) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
            b"8\r\ndata: 1\n\r\n"
        )
        await writer.drain()
        await more.wait()
        writer.write(b"8\r\ndata: 2\n\r\n0\r\n\r\n")
        await writer.drain()
        return True

    async def scenario() -> None:
        async with Replica(stream) as replica:
            client = upstream()
            response = await client.post(replica.url, "/x", b"{}")
            assert (response.content_type, response.content_length) == (b"text/event-stream", None)
            assert await response.read() == b"data: 1\n"  # before the replica sent the rest
            assert not response.done
            more.set()
            assert await response.read() == b"data: 2\n"
            assert await response.read() == b""
            assert response.done
            response.close()
            # Read to the end: the connection went back to the pool.
            await read_all(await client.post(replica.url, "/x", b"{}"))
            assert replica.connections == 1
            await client.close()

    run(scenario())


def test_closing_an_unfinished_answer_hangs_up_so_the_replica_stops():
    async def endless(reader, writer, head, body) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        async with Replica(endless) as replica:
            client = upstream()
            response = await client.post(replica.url, "/x", b"{}")
            assert await response.read()
            response.close()
            await asyncio.wait_for(replica.hung_up.wait(), 2)
            assert client.open_connections == 0
            await client.close()

    run(scenario())


def test_a_replica_dying_mid_answer_breaks_the_read():
    async def die(reader, writer, head, body) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        await writer.drain()
        return False

    async def scenario() -> None:
        async with Replica(die) as replica:
            client = upstream()
            response = await client.post(replica.url, "/x", b"{}")
            with pytest.raises(UpstreamBroken):
                await read_all(response)
            await client.close()

    run(scenario())


def test_a_slow_reader_pauses_the_replica_instead_of_buffering_everything():
    total = 64 * HIGH_WATER  # more than loopback's socket buffers hold
    sent = asyncio.Event()

    async def flood(reader, writer, head, body) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        for _ in range(total // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()
        sent.set()
        return True

    async def scenario() -> None:
        async with Replica(flood) as replica:
            client = upstream()
            response = await client.post(replica.url, "/x", b"{}")
            await asyncio.sleep(0.5)  # nobody reads: the client stops reading the socket
            assert not sent.is_set()
            received = 0
            while chunk := await response.read():
                # At most the mark plus one read of the socket was taken in.
                assert len(chunk) <= 3 * HIGH_WATER
                received += len(chunk)
            response.close()
            assert received == total
            await asyncio.wait_for(sent.wait(), 2)
            await client.close()

    run(scenario())


def test_at_the_connection_limit_a_request_waits_for_a_connection_to_free():
    release = asyncio.Event()

    async def held(reader, writer, head, body) -> bool:
        if body == b"first":
            await release.wait()
        writer.write(plain(body))
        await writer.drain()
        return True

    async def scenario() -> None:
        async with Replica(held) as replica:
            client = upstream(max_connections=1)
            first = asyncio.ensure_future(client.post(replica.url, "/x", b"first"))
            await asyncio.sleep(0.1)
            second = asyncio.ensure_future(client.post(replica.url, "/x", b"second"))
            await asyncio.sleep(0.1)
            assert not second.done()
            assert client.open_connections == 1
            release.set()
            assert await read_all(await first) == b"first"
            assert await read_all(await second) == b"second"
            assert replica.connections == 1
            await client.close()

    run(scenario())


def test_cancelled_while_waiting_for_the_answer_hangs_up():
    async def never(reader, writer, head, body) -> bool:
        await reader.read()  # no answer, until the client hangs up
        return False

    async def scenario() -> None:
        async with Replica(never) as replica:
            client = upstream()
            waiting = asyncio.ensure_future(client.post(replica.url, "/x", b"{}"))
            await asyncio.sleep(0.1)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await asyncio.wait_for(replica.hung_up.wait(), 2)
            assert client.open_connections == 0
            await client.close()

    run(scenario())


def test_connection_close_from_the_replica_is_honoured():
    async def once(reader, writer, head, body) -> bool:
        writer.write(plain(b"{}", extra=b"connection: close\r\n"))
        await writer.drain()
        await asyncio.sleep(0.5)  # the client must not wait for this to hang up
        return True

    async def scenario() -> None:
        async with Replica(once) as replica:
            client = upstream()
            for _ in range(2):
                assert await read_all(await client.post(replica.url, "/x", b"{}")) == b"{}"
            assert replica.connections == 2
            await client.close()

    run(scenario())


def test_a_header_value_with_a_line_break_is_refused_before_sending():
    async def scenario() -> None:
        async with Replica() as replica:
            client = upstream()
            with pytest.raises(ValueError, match="line break"):
                await client.post(replica.url, "/x", b"{}", ((b"x-request-id", b"a\r\nb: c"),))
            assert replica.requests == []
            await client.close()

    run(scenario())


def test_an_answer_completed_while_reading_was_paused_leaves_a_connection_that_reads():
    """GIVEN an answer whose last segment both crosses the read-ahead mark and completes it,
    taken by a client that reads only after it has all arrived
    WHEN the next request goes out on the same kept-alive connection
    THEN it is answered: the connection went back to the pool reading, not paused."""
    first_part = HIGH_WATER - 1000
    rest = 10_000  # one small segment: it crosses the mark and ends the body at once
    head_and_first_sent = asyncio.Event()

    async def in_two_parts(reader, writer, head, body) -> bool:
        if body != b"big":
            writer.write(plain(b"small"))
            await writer.drain()
            return True
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (first_part + rest))
        writer.write(b"a" * first_part)
        await writer.drain()
        head_and_first_sent.set()
        await asyncio.sleep(0.2)  # the client has taken the first part in by now
        writer.write(b"b" * rest)
        await writer.drain()
        return True

    async def scenario() -> None:
        async with Replica(in_two_parts) as replica:
            client = upstream()
            response = await client.post(replica.url, "/x", b"big")
            await head_and_first_sent.wait()
            await asyncio.sleep(0.5)  # a slow client: everything arrives before it reads
            assert await read_all(response) == b"a" * first_part + b"b" * rest
            answer = await asyncio.wait_for(client.post(replica.url, "/x", b"next"), 3)
            assert await asyncio.wait_for(read_all(answer), 3) == b"small"
            assert replica.connections == 1  # the kept-alive connection, reading again
            await client.close()

    run(scenario())


def test_a_freed_connection_woken_for_a_waiter_that_is_cancelled_goes_to_the_next():
    """GIVEN a pool at its limit of one connection and two requests waiting for it
    WHEN the connection frees and the waiter it woke is cancelled before it could run
    THEN the other waiter gets the connection instead of waiting beside an idle one."""
    release = asyncio.Event()

    async def held(reader, writer, head, body) -> bool:
        if body == b"first":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
            await writer.drain()
            await release.wait()
            writer.write(b"first")
        else:
            writer.write(plain(body))
        await writer.drain()
        return True

    async def scenario() -> None:
        async with Replica(held) as replica:
            client = upstream(max_connections=1)
            first = await client.post(replica.url, "/x", b"first")  # the head only, so far
            woken = asyncio.ensure_future(client.post(replica.url, "/x", b"woken"))
            await asyncio.sleep(0.05)
            other = asyncio.ensure_future(client.post(replica.url, "/x", b"other"))
            await asyncio.sleep(0.05)
            assert not woken.done()
            assert not other.done()
            release.set()
            # The body's last byte frees the connection in the same callback that wakes this
            # read, and wakes the first waiter after it: cancel that waiter before it runs.
            assert await first.read() == b"first"
            assert first.done
            woken.cancel()
            answer = await asyncio.wait_for(other, 3)
            assert await read_all(answer) == b"other"
            with pytest.raises(asyncio.CancelledError):
                await woken
            first.close()
            await client.close()

    run(scenario())


def test_interim_1xx_answers_are_skipped_for_the_final_one():
    async def interim_first(reader, writer, head, body) -> bool:
        writer.write(
            b"HTTP/1.1 100 Continue\r\n\r\n"
            b"HTTP/1.1 103 Early Hints\r\ncontent-type: text/html\r\nlink: </a>\r\n\r\n"
        )
        await writer.drain()
        await asyncio.sleep(0.05)  # the final answer in another segment
        writer.write(plain(body))
        await writer.drain()
        return True

    async def scenario() -> None:
        async with Replica(interim_first) as replica:
            client = upstream()
            for n in range(2):
                response = await client.post(replica.url, "/x", b"%d" % n)
                assert (response.status, response.content_type) == (200, b"application/json")
                assert await read_all(response) == b"%d" % n
            assert replica.connections == 1
            await client.close()

    run(scenario())


def test_a_body_delimited_by_the_close_of_the_connection_is_complete():
    """GIVEN an answer with neither Content-Length nor chunked framing (HTTP/1.0 style)
    WHEN the replica closes the connection after the body
    THEN the body is whole (not a cut connection) and the connection is not reused."""

    async def until_close(reader, writer, head, body) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"all of " + body)
        await writer.drain()
        return False

    async def scenario() -> None:
        async with Replica(until_close) as replica:
            client = upstream()
            for n in range(2):
                response = await client.post(replica.url, "/x", b"%d" % n)
                assert (response.status, response.content_length) == (200, None)
                assert await read_all(response) == b"all of %d" % n
                assert response.done
            assert replica.connections == 2
            await client.close()

    run(scenario())


@pytest.mark.parametrize("status", [204, 304])
def test_a_204_or_304_has_no_body_whatever_its_headers_say(status: int):
    async def empty(reader, writer, head, body) -> bool:
        writer.write(b"HTTP/1.1 %d Nothing\r\ncontent-length: 5\r\n\r\n" % status)
        await writer.drain()
        return True

    async def scenario() -> None:
        async with Replica(empty) as replica:
            client = upstream()
            for _ in range(2):
                response = await client.post(replica.url, "/x", b"{}")
                assert response.status == status
                # Not a length to relay: the gateway would promise its client 5 bytes.
                assert response.content_length is None
                assert await asyncio.wait_for(read_all(response), 2) == b""
            assert replica.connections == 1
            await client.close()

    run(scenario())


@pytest.mark.parametrize("split", [False, True])
def test_an_answer_head_over_the_bound_is_malformed(split: bool):
    """A replica's head is bounded (MAX_HEAD_BYTES), whether it comes in one segment with
    its body or keeps coming without an end: an unbounded one would fill the gateway."""

    async def huge_head(reader, writer, head, body) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nx-filler: ")
        for _ in range(MAX_HEAD_BYTES // 4096 + 2):
            if split:
                await writer.drain()
                await asyncio.sleep(0)
            writer.write(b"f" * 4096)
        writer.write(b"\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        await reader.read()
        return False

    async def within_bound(reader, writer, head, body) -> bool:
        writer.write(plain(b"{}", extra=b"x-filler: %s\r\n" % (b"f" * (MAX_HEAD_BYTES // 2))))
        await writer.drain()
        return True

    async def scenario() -> None:
        client = upstream()
        async with Replica(within_bound) as replica:
            assert await read_all(await client.post(replica.url, "/x", b"{}")) == b"{}"
        async with Replica(huge_head) as replica:
            with pytest.raises(UpstreamMalformed):
                await client.post(replica.url, "/x", b"{}")
            await asyncio.wait_for(replica.hung_up.wait(), 2)
        await client.close()

    run(scenario())


def test_bytes_after_a_complete_answer_keep_its_connection_out_of_the_pool():
    """GIVEN an answer followed, in the same segment, by the start of an answer no one asked
    for
    WHEN the next request goes out
    THEN it is on a new connection and answered: the parser of the old one is mid-message."""

    async def and_more(reader, writer, head, body) -> bool:
        if body == b"first":
            writer.write(plain(b"first") + b"HTTP/1.1 200 OK\r\n")
        else:
            writer.write(plain(body))
        await writer.drain()
        return True

    async def scenario() -> None:
        async with Replica(and_more) as replica:
            client = upstream()
            assert await read_all(await client.post(replica.url, "/x", b"first")) == b"first"
            answer = await asyncio.wait_for(client.post(replica.url, "/x", b"second"), 3)
            assert await read_all(answer) == b"second"
            assert replica.connections == 2
            await client.close()

    run(scenario())
