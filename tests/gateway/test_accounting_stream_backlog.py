"""The accounting streams keep every record the persister has not read (issue 10, item 13).

The gateway used to trim ``sy:usage`` / ``sy:decisions`` with ``MAXLEN ~ 1000000`` on every
write, read or not: a persister that lagged lost records silently. Now only what the
persister's consumer group has read and acknowledged is trimmed (records/usage.py), and
the gateway exports the backlog (``switchyard_gateway_accounting_stream_unread`` and
friends) and warns when it grows. Real Valkey throughout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
import valkey
import valkey.asyncio as avalkey
from prometheus_client.parser import text_string_to_metric_families

from gateway.accounting import DECISIONS_STREAM, PERSISTER_GROUP, USAGE_STREAM, Accounting
from gateway.metrics import GatewayMetrics

GROUP = PERSISTER_GROUP
BACKLOG = 1_000_000  # what the stream held when the gateway used to trim it to this


def usage(accounting: Accounting, n: int) -> None:
    accounting.record_usage(
        request_id=f"r-{n}",
        tenant="acme",
        use_case_id=7,
        key_id=11,
        model="llama-test",
        replica="http://10.0.0.5:8000",
        status=200,
        prompt_tokens=10,
        completion_tokens=2,
        queued_ms=0,
        upstream_ms=9,
        total_ms=10,
        policy_version=3,
    )


async def settle(accounting: Accounting, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while accounting.pending:
        assert time.monotonic() < deadline, f"{accounting.pending} records never flushed"
        await asyncio.sleep(0.01)


def fill(client: valkey.Valkey, stream: str, count: int) -> None:
    """``count`` entries written server-side (one script per 100k: quick, and no round trip
    per entry)."""
    script = client.register_script(
        "for i = 1, tonumber(ARGV[1]) do redis.call('XADD', KEYS[1], '*', 'n', i) end"
    )
    left = count
    while left:
        step = min(left, 100_000)
        script(keys=[stream], args=[step])
        left -= step


def sample(metrics: GatewayMetrics, name: str, stream: str) -> float | None:
    body, _ = metrics.render()
    for family in text_string_to_metric_families(body.decode()):
        for found in family.samples:
            if found.name == name and found.labels == {"stream": stream}:
                return found.value
    return None


def test_a_lagging_persister_loses_nothing_the_gateway_writes(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    """GIVEN a persister that has read nothing of a stream already a million entries long,
    WHEN the gateway writes 500 more records, THEN every entry is still there, the oldest
    unread one included."""
    valkey_client.xgroup_create(USAGE_STREAM, GROUP, id="0", mkstream=True)
    fill(valkey_client, USAGE_STREAM, BACKLOG)
    first: Any = valkey_client.xrange(USAGE_STREAM, count=1)
    oldest = first[0][0]

    async def write() -> None:
        client = avalkey.Valkey.from_url(valkey_url)
        accounting = Accounting(client)
        await accounting.start()
        for n in range(500):
            usage(accounting, n)
        await settle(accounting)
        await accounting.close()
        await client.aclose()

    asyncio.run(write())

    assert valkey_client.xlen(USAGE_STREAM) == BACKLOG + 500
    first = valkey_client.xrange(USAGE_STREAM, count=1)
    assert first[0][0] == oldest


def test_the_backlog_is_exported_and_warned_about(
    valkey_client: valkey.Valkey, valkey_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """GIVEN 30 usage records of which the persister has read 10 and acknowledged 6, and no
    consumer group at all on the decision stream, THEN the gateway's metrics say how long
    each stream is, how much is unread and pending, and it warns once over its bound."""
    valkey_client.xgroup_create(USAGE_STREAM, GROUP, id="0", mkstream=True)
    for n in range(30):
        valkey_client.xadd(USAGE_STREAM, {"n": n})
    for n in range(3):
        valkey_client.xadd(DECISIONS_STREAM, {"n": n})
    read: Any = valkey_client.xreadgroup(GROUP, "persister-1", {USAGE_STREAM: ">"}, count=10)
    valkey_client.xack(USAGE_STREAM, GROUP, *[entry_id for entry_id, _ in read[0][1][:6]])
    metrics = GatewayMetrics(process_collectors=False)

    async def check() -> None:
        client = avalkey.Valkey.from_url(valkey_url)
        accounting = Accounting(client, metrics=metrics, backlog_warning=15)
        await accounting.check_backlog()
        await accounting.check_backlog()  # still over: no second warning
        await accounting.close()
        await client.aclose()

    with caplog.at_level(logging.WARNING, logger="gateway.accounting"):
        asyncio.run(check())

    prefix = "switchyard_gateway_accounting_stream_"
    assert sample(metrics, prefix + "length", USAGE_STREAM) == 30
    assert sample(metrics, prefix + "unread", USAGE_STREAM) == 20
    assert sample(metrics, prefix + "pending", USAGE_STREAM) == 4
    assert sample(metrics, prefix + "length", DECISIONS_STREAM) == 3
    assert sample(metrics, prefix + "unread", DECISIONS_STREAM) == 3  # no persister yet
    assert sample(metrics, prefix + "pending", DECISIONS_STREAM) == 0
    warnings = [r.getMessage() for r in caplog.records if "accounting_backlog" in r.getMessage()]
    assert len(warnings) == 1
    assert USAGE_STREAM in warnings[0]
    assert "unread=20" in warnings[0]
