"""The fleet client held to h11 on generated answers (STYLE.md, convention 13).

gateway/upstream.py parses replicas' answers with its own code over httptools, for speed;
examples alone do not cover framing. Here hypothesis generates answers — Content-Length,
chunked with extensions and trailers, close-delimited, 1xx before the final answer, 204 and
304, malformed framing, oversized heads, bytes after a complete answer — that a real loopback
server writes split at random byte boundaries, while the client reads fast or slowly or gives
up at a random point. Whatever h11 parses from the same bytes, the client must yield: the same
status and exactly the same body, or an UpstreamBroken where h11 finds the answer broken.
After every exchange, the pool may hold only idle connections that are reading, and the next
request through it must be answered.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import h11
import uvloop
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

from gateway.upstream import HIGH_WATER, MAX_HEAD_BYTES, Upstream, UpstreamBroken

SENTINEL = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nnext"
TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
VALUE = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40
)
SMALL_BODY = st.binary(max_size=300)


@dataclass(frozen=True)
class Answer:
    """What the replica writes for one request, and whether it closes the connection after."""

    wire: bytes
    close: bool
    # Broken whatever h11 says: a head over MAX_HEAD_BYTES (h11 bounds only a head it has
    # not seen the end of), or framing RFC 9112 lets a client refuse and h11 takes.
    refused: bool = False


@st.composite
def headers(draw: st.DrawFn) -> bytes:
    """Headers that say nothing about framing."""
    names = st.sampled_from(["content-type", "server", "x-request-id", "date"]) | TOKEN.map(
        lambda t: "x-" + t
    )
    lines = draw(st.lists(st.tuples(names, VALUE), max_size=4))
    return b"".join(b"%s: %s\r\n" % (n.encode(), v.encode()) for n, v in lines)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """Mostly small; now and then past the read-ahead mark (HIGH_WATER), to pause reading."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(min_size=1, max_size=64)) * draw(st.integers(4000, 6000))
    return draw(SMALL_BODY)


def status_line(status: int, version: bytes = b"1.1") -> bytes:
    return b"HTTP/%s %d Reason\r\n" % (version, status)


STATUS = st.sampled_from([200, 201, 400, 404, 429, 500, 503])


@st.composite
def interims(draw: st.DrawFn) -> bytes:
    codes = draw(st.lists(st.sampled_from([100, 102, 103]), max_size=2))
    return b"".join(status_line(code) + draw(headers()) + b"\r\n" for code in codes)


@st.composite
def with_length(draw: st.DrawFn) -> Answer:
    body = draw(bodies())
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    head = status_line(draw(STATUS), version) + draw(headers())
    head += b"content-length: %d\r\n" % len(body)
    close = draw(st.booleans())
    if close and version == b"1.1" and draw(st.booleans()):
        head += b"connection: close\r\n"
    return Answer(draw(interims()) + head + b"\r\n" + body, close=close or version == b"1.0")


def extension(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["none", "none", "token", "quoted", "bare"]))
    name = draw(TOKEN).encode()
    if kind == "token":
        return b";%s=%s" % (name, draw(TOKEN).encode())
    if kind == "quoted":
        return b';%s="%s"' % (name, draw(TOKEN).encode())
    return b";" + name if kind == "bare" else b""


@st.composite
def chunked(draw: st.DrawFn) -> Answer:
    chunks = draw(st.lists(st.binary(min_size=1, max_size=300), max_size=5))
    if draw(st.integers(0, 9)) == 0:
        chunks.append(draw(bodies()) or b"x")
    head = status_line(draw(STATUS)) + draw(headers()) + b"transfer-encoding: chunked\r\n\r\n"
    wire = b"".join(b"%x%s\r\n%s\r\n" % (len(chunk), extension(draw), chunk) for chunk in chunks)
    trailers = draw(headers())
    wire += b"0%s\r\n%s\r\n" % (extension(draw), trailers)
    return Answer(draw(interims()) + head + wire, close=draw(st.booleans()))


@st.composite
def close_delimited(draw: st.DrawFn) -> Answer:
    version = draw(st.sampled_from([b"1.1", b"1.0"]))
    head = status_line(draw(STATUS), version) + draw(headers()) + b"\r\n"
    return Answer(draw(interims()) + head + draw(bodies()), close=True)


@st.composite
def without_body(draw: st.DrawFn) -> Answer:
    head = status_line(draw(st.sampled_from([204, 304]))) + draw(headers())
    framing = draw(st.sampled_from([b"", b"content-length: 0\r\n", b"content-length: 7\r\n"]))
    return Answer(draw(interims()) + head + framing + b"\r\n", close=draw(st.booleans()))


@st.composite
def malformed(draw: st.DrawFn) -> Answer:
    ok = status_line(200)
    body = draw(st.binary(min_size=1, max_size=100))
    wire = draw(
        st.sampled_from(
            [
                ok + b"transfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
                ok + b"transfer-encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",
                ok + b"transfer-encoding: chunked\r\n\r\n%x\r\n%s" % (len(body) + 5, body),
                ok + b"transfer-encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
                ok + b"content-length: 3\r\ncontent-length: 4\r\n\r\nabcd",
                ok + b"content-length: abc\r\n\r\nabc",
                ok + b"content-length: %d\r\n\r\n%s" % (len(body) + 10, body),
                ok + b"no colon here\r\n\r\n",
                b"HTTP/1.1 2x0 Reason\r\ncontent-length: 0\r\n\r\n",
                b"SMTP ready\r\n\r\n",
                status_line(101) + b"upgrade: h2c\r\nconnection: upgrade\r\n\r\n",
                ok + b"content-type: text/plain\r\n",  # the head never ends
            ]
        )
    )
    refused = False
    if draw(st.integers(0, 12)) == 0:
        # Content-Length and chunked together: "ought to be handled as an error" (RFC 9112
        # section 6.3; a sign of response splitting). httptools refuses it, h11 reads it.
        wire = ok + b"content-length: 3\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        refused = True
    cut = draw(st.integers(0, 3)) == 0  # sometimes cut short somewhere inside, too
    if cut and len(wire) > 1:
        wire = wire[: draw(st.integers(1, len(wire) - 1))]
    return Answer(wire, close=True, refused=refused)


@st.composite
def oversized(draw: st.DrawFn) -> Answer:
    size = draw(st.integers(MAX_HEAD_BYTES + 1024, MAX_HEAD_BYTES + 40 * 1024))
    head = status_line(200) + b"x-filler: " + b"f" * size + b"\r\ncontent-length: 2\r\n\r\n{}"
    return Answer(draw(interims()) + head, close=True, refused=True)


@st.composite
def then_more(draw: st.DrawFn) -> Answer:
    """A complete answer, then bytes no one asked for (a second answer, or noise): the
    client takes the first and must not put the connection back in the pool."""
    first = draw(with_length())
    more = draw(st.sampled_from([SENTINEL, b"junk", b"HTTP/1.1 200 OK\r\n"]))
    return Answer(first.wire + more, close=first.close)


ANSWERS = st.one_of(
    with_length(),
    chunked(),
    close_delimited(),
    without_body(),
    malformed(),
    oversized(),
    then_more(),
)


def h11_reads(answer: Answer) -> tuple[int, bytes] | None:
    """(status, body) as h11 reads the answer to a POST; None when it finds it broken."""
    if answer.refused:
        return None
    client = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
    client.send(
        h11.Request(method="POST", target="/x", headers=[("host", "r"), ("content-length", "2")])
    )
    client.send(h11.Data(data=b"{}"))
    client.send(h11.EndOfMessage())
    client.receive_data(answer.wire)
    status, body, closed = 0, bytearray(), False
    try:
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                if not answer.close or closed:
                    return None  # never ends (the client would wait for its deadline)
                client.receive_data(b"")
                closed = True
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                return None
    except h11.RemoteProtocolError:
        return None


@dataclass(frozen=True)
class Client:
    """How the client behaves: reading at once or slowly, and where, if anywhere, it gives up."""

    slow: bool
    give_up: tuple[str, int] | None  # ("head", loop turns) or ("body", reads)


CLIENTS = st.builds(
    Client,
    slow=st.booleans(),
    give_up=st.none()
    | st.tuples(st.just("head"), st.integers(0, 6))
    | st.tuples(st.just("body"), st.integers(0, 3)),
)


class Replica:
    """A loopback server answering "script" with the answer, written in pieces, and anything
    else with SENTINEL."""

    def __init__(self, answer: Answer, cuts: list[int]) -> None:
        self.answer = answer
        self.cuts = cuts
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Replica:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                found = re.search(rb"(?i)content-length: *(\d+)", head)
                body = await reader.readexactly(int(found.group(1))) if found else b""
                if body != b"script":
                    writer.write(SENTINEL)
                    await writer.drain()
                    continue
                wire, start = self.answer.wire, 0
                for cut in [*self.cuts, len(wire)]:
                    writer.write(wire[start:cut])
                    start = cut
                    await writer.drain()
                    await asyncio.sleep(0)  # a segment of its own, mostly
                if self.answer.close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def exchange(client: Upstream, url: str, how: Client) -> tuple[int, bytes] | str | None:
    """(status, body) as the client reads them; None when it raised UpstreamBroken; "gave up"
    when it gave up first."""
    posting = asyncio.ensure_future(client.post(url, "/x", b"script"))
    if how.give_up is not None and how.give_up[0] == "head":
        for _ in range(how.give_up[1]):
            await asyncio.sleep(0)
        if not posting.done():
            posting.cancel()
            try:
                await posting
            except (asyncio.CancelledError, UpstreamBroken):
                return "gave up"
    try:
        response = await posting
    except UpstreamBroken:
        return None
    body = bytearray()
    try:
        reads = 0
        while True:
            if how.give_up is not None and how.give_up == ("body", reads):
                return "gave up"
            if how.slow:
                await asyncio.sleep(0.002)
            chunk = await response.read()
            reads += 1
            if not chunk:
                assert response.done
                if response.content_length is not None:  # the gateway relays it as it is
                    assert int(response.content_length) == len(body)
                return response.status, bytes(body)
            body += chunk
    except UpstreamBroken:
        return None
    finally:
        response.close()


def assert_pool_holds_only_idle_reading_connections(client: Upstream) -> None:
    """Every pooled connection is idle and reading, or closing (which the pool never hands
    out: the replica's close has reached it, its connection_lost is on its way)."""
    for origin in client._origins.values():
        for connection in origin.idle:
            transport = connection.transport
            assert transport is not None
            if not transport.is_closing():
                assert connection.response is None
                assert transport.is_reading()


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(asyncio.wait_for(coroutine, 20))


BIG = HIGH_WATER + 9000
BIG_HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % BIG
AT_ONCE = Client(slow=False, give_up=None)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(answer=ANSWERS, cuts=st.lists(st.integers(1, 1 << 20), max_size=6), how=CLIENTS)
# The defects this test was written against, whatever the generator draws:
# an interim answer taken for the final one,
@example(Answer(b"HTTP/1.1 100 Continue\r\n\r\n" + SENTINEL, close=False), [], AT_ONCE)
# a close-delimited body taken for a cut connection,
@example(Answer(b"HTTP/1.1 200 OK\r\n\r\nall", close=True), [], AT_ONCE)
# a connection pooled with its parser inside an answer no one asked for,
@example(Answer(SENTINEL + b"HTTP/1.1 200 OK\r\n", close=False), [], AT_ONCE)
# and one pooled paused: the last segment both crossed the read-ahead mark and ended it.
@example(
    Answer(BIG_HEAD + b"b" * BIG, close=False),
    [len(BIG_HEAD) + HIGH_WATER - 1000],
    Client(slow=True, give_up=None),
)
def test_the_client_reads_every_answer_as_h11_does(
    answer: Answer, cuts: list[int], how: Client
) -> None:
    cuts = sorted({cut % len(answer.wire) for cut in cuts} - {0})
    expected = h11_reads(answer)
    shown = answer.wire if len(answer.wire) < 600 else answer.wire[:600] + b"..."
    note(f"wire={shown!r} close={answer.close} cuts={cuts} {how} h11={expected!r:.200}")

    async def scenario() -> None:
        async with Replica(answer, cuts) as replica:
            client = Upstream(connect_timeout_s=2.0, max_connections=4)
            try:
                if expected is None and not answer.close:
                    return  # h11 waits for more too: nothing to compare, a deadline's case
                got = await exchange(client, replica.url, how)
                if got != "gave up":
                    assert got == expected
                await asyncio.sleep(0)  # let what the replica did after reach the client
                assert_pool_holds_only_idle_reading_connections(client)
                # Whatever happened, the next request through the pool gets its answer.
                following = await asyncio.wait_for(client.post(replica.url, "/x", b"next"), 3)
                try:
                    assert await asyncio.wait_for(following.read(), 3) == b"next"
                finally:
                    following.close()
            finally:
                await client.close()

    run(scenario())
