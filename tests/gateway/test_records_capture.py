"""The capture and hand-off of full records, piece by piece (gateway/records.py and the
transcript half of gateway/accounting.py).

The packer writes RESP by hand, so generated transcripts (any bytes, in any chunks) are held
to libvalkey's own packing and read back from a real Valkey. The byte budget is proved
against a real Valkey too: content is refused past it and the budget comes back once the
buffer is written.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import libvalkey
import orjson
import pytest
import valkey
import valkey.asyncio as avalkey
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.accounting import (
    RECORD_FIELDS,
    RECORDS_STREAM,
    USAGE_FIELDS,
    USAGE_STREAM,
    Accounting,
    Content,
    Usage,
    _XaddPacker,
)
from gateway.metrics import GatewayMetrics
from gateway.records import Recorder, capped, file_digests, upload_description
from runtime.multipart import Form, Upload


def usage(n: int = 0, record: str = "full") -> Usage:
    return Usage(
        request_id=f"req-{n}",
        at_ms=1_700_000_000_000 + n,
        tenant="acme",
        use_case_id=7,
        key_id=11,
        model="llama-test",
        replica="http://10.0.0.5:8000",
        status=200,
        prompt_tokens=12,
        completion_tokens=3,
        queued_ms=0.4,
        upstream_ms=25.0,
        total_ms=26.6,
        policy_version=3,
        record_id=f"{n:032x}",
        endpoint="/v1/chat/completions",
        streamed=True,
        record=record,
    )


def test_the_usage_entry_is_the_contracts_fields_in_order() -> None:
    assert Usage._fields == USAGE_FIELDS
    assert RECORD_FIELDS[: len(USAGE_FIELDS)] == USAGE_FIELDS


chunks = st.lists(st.binary(max_size=64), max_size=8)


@settings(max_examples=200, deadline=None)
@given(request=chunks, response=chunks, content_type=st.binary(max_size=40))
def test_a_packed_transcript_is_what_libvalkey_packs(
    request: list[bytes], response: list[bytes], content_type: bytes
) -> None:
    """Any bytes (CR LF, NUL, invalid UTF-8), in any chunks, framed as the library frames
    the joined values."""
    packer = _XaddPacker(RECORDS_STREAM, RECORD_FIELDS)
    record = usage()
    values: tuple[object, ...] = (
        *record,
        Content(request, sum(map(len, request))),
        Content(response, sum(map(len, response))),
        content_type,
        False,
    )
    wire = [
        "1" if v is True else "0" if v is False else "" if v is None else v
        for v in (*record, b"".join(request), b"".join(response), content_type, False)
    ]
    wire = [str(round(v)) if isinstance(v, float) else v for v in wire]
    fields: list[Any] = []
    for field, value in zip(RECORD_FIELDS, wire, strict=True):
        fields += (field, value)
    assert packer.pack(values) == libvalkey.pack_command(("XADD", RECORDS_STREAM, "*", *fields))


# --- the recorder ---------------------------------------------------------------------------
class Sink:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def __call__(self, message: Any) -> None:
        self.messages.append(message)


def test_the_recorder_passes_every_message_on_and_keeps_the_body_up_to_its_limit() -> None:
    sink = Sink()
    recorder = Recorder(sink, limit=10)
    messages: list[dict[str, Any]] = [
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream"), (b"x-request-id", b"r")],
        },
        {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True},
        {"type": "http.response.body", "body": b"", "more_body": True},
        {"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True},
        {"type": "http.response.body", "body": b"data: [DONE]\n\n"},
    ]

    async def send_all() -> None:
        for message in messages:
            await recorder(message)

    asyncio.run(send_all())
    assert sink.messages == messages
    assert (recorder.status, recorder.content_type) == (200, b"text/event-stream")
    assert recorder.truncated
    assert b"".join(recorder.response.parts) == b"data: 1\n\nd"
    assert recorder.response.size == 10


def test_a_body_exactly_at_the_limit_is_not_truncated() -> None:
    recorder = Recorder(Sink(), limit=4)
    asyncio.run(recorder({"type": "http.response.body", "body": b"abcd"}))
    assert not recorder.truncated
    assert capped(b"abcd", 4) == (Content((b"abcd",), 4), False)
    assert capped(b"abcde", 4) == (Content((b"abcd",), 4), True)


def test_an_upload_is_described_by_its_fields_and_each_files_digest() -> None:
    audio = b"RIFF" + bytes(range(256))
    form = Form(
        fields={"model": "whisper", "language": "de"},
        files={"file": Upload("call.wav", "audio/wav", audio)},
    )
    described = orjson.loads(upload_description(form, file_digests(form)))
    assert described == {
        "multipart": True,
        "fields": {"model": "whisper", "language": "de"},
        "files": {
            "file": {
                "filename": "call.wav",
                "content_type": "audio/wav",
                "size": len(audio),
                "sha256": hashlib.sha256(audio).hexdigest(),
            }
        },
    }


# --- the byte budget ------------------------------------------------------------------------
def metric(metrics: GatewayMetrics, name: str, labels: str) -> float:
    body, _ = metrics.render()
    for line in body.decode().splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def flushed(accounting: Accounting, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while accounting.pending:
        assert time.monotonic() < deadline, "never flushed"
        await asyncio.sleep(0.01)


def test_content_past_the_byte_budget_is_dropped_and_the_budget_returns_once_written(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    """GIVEN a budget for one transcript of 1,000 bytes WHEN a second arrives before the
    first is written THEN it is refused (counted by reason) while usage still goes through;
    once the first is written the budget is free again."""
    body = Content((b"x" * 1000,), 1000)
    metrics = GatewayMetrics(process_collectors=False)

    async def scenario() -> list[bool]:
        client = avalkey.Valkey.from_url(valkey_url)
        accounting = Accounting(
            client,
            metrics=metrics,
            content_budget_bytes=1500,
            flush_interval_s=3600,  # written only when the test flushes
        )
        kept = [
            accounting.record_transcript(
                usage(0), request=body, response=Content((), 0), response_type=b"", truncated=False
            ),
            accounting.record_transcript(
                usage(1), request=body, response=Content((), 0), response_type=b"", truncated=False
            ),
        ]
        accounting.append_usage(usage(1, record="full_dropped"))
        assert accounting.content_bytes > 1000
        assert await accounting.flush_once()
        assert accounting.content_bytes == 0
        kept.append(
            accounting.record_transcript(
                usage(2), request=body, response=Content((), 0), response_type=b"", truncated=False
            )
        )
        await accounting.close()
        assert accounting.content_bytes == 0
        await client.aclose()
        return kept

    assert asyncio.run(scenario()) == [True, False, True]
    records: Any = valkey_client.xrange(RECORDS_STREAM)
    assert [fields[b"record_id"] for _, fields in records] == [
        f"{0:032x}".encode(),
        f"{2:032x}".encode(),
    ]
    assert records[0][1][b"request"] == b"x" * 1000
    assert records[0][1][b"streamed"] == b"1"
    usage_entries: Any = valkey_client.xrange(USAGE_STREAM)
    [(_, dropped)] = usage_entries
    assert dropped[b"record"] == b"full_dropped"
    assert (
        metric(metrics, "switchyard_gateway_records_content_dropped_total", 'reason="buffer_bytes"')
        == 1
    )


def test_content_is_dropped_when_the_buffer_is_full_by_count() -> None:
    dead = avalkey.Valkey(port=1, socket_connect_timeout=0.1)  # never written: stays full
    metrics = GatewayMetrics(process_collectors=False)

    async def scenario() -> bool:
        accounting = Accounting(dead, metrics=metrics, buffer_limit=1, flush_interval_s=3600)
        accounting.append_usage(usage(0))
        kept = accounting.record_transcript(
            usage(1),
            request=Content((b"q",), 1),
            response=Content((b"a",), 1),
            response_type=b"application/json",
            truncated=False,
        )
        await accounting.close(timeout_s=0.2)
        return kept

    assert asyncio.run(scenario()) is False
    assert (
        metric(metrics, "switchyard_gateway_records_content_dropped_total", 'reason="buffer_full"')
        == 1
    )


@pytest.mark.parametrize("truncated", [True, False])
def test_a_written_transcript_reads_back_byte_for_byte(
    valkey_client: valkey.Valkey, valkey_url: str, truncated: bool
) -> None:
    request = [b'{"model":"m","messages":[{"role":"user","content":"caf\xc3\xa9\r\n"}]}']
    response = [b'data: {"a":1}\n\n', b"\x00\xff", b"data: [DONE]\n\n"]

    async def scenario() -> None:
        client = avalkey.Valkey.from_url(valkey_url)
        accounting = Accounting(client, flush_interval_s=0.01)
        await accounting.start()
        assert accounting.record_transcript(
            usage(5),
            request=Content(request, sum(map(len, request))),
            response=Content(response, sum(map(len, response))),
            response_type=b"text/event-stream; charset=utf-8",
            truncated=truncated,
        )
        await flushed(accounting)
        await accounting.close()
        await client.aclose()

    asyncio.run(scenario())
    written: Any = valkey_client.xrange(RECORDS_STREAM)
    [(_, fields)] = written
    assert sorted(k.decode() for k in fields) == sorted(RECORD_FIELDS)
    assert fields[b"request"] == b"".join(request)
    assert fields[b"response"] == b"".join(response)
    assert fields[b"response_type"] == b"text/event-stream; charset=utf-8"
    assert fields[b"truncated"] == (b"1" if truncated else b"0")
    assert fields[b"upstream_ms"] == b"25"
