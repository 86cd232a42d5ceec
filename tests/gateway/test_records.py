"""What the gateway keeps of each request, per its use case's record policy (issue 12).

Real processes: the gateway (uvicorn), the vLLM simulator and Valkey; the streams are read
back with XRANGE. Personas: alice's use case keeps ``full`` records, bob's only
``metadata`` (the default), carol's ``none``.

GIVEN a full-record use case WHEN it chats, plain or streamed, through the OpenAI SDK or raw
HTTP THEN ``sy:records`` holds the request as forwarded and the response byte for byte as
the client read it, under the record id the client got in ``x-switchyard-record-id``; the
usage entry says ``record=full``. A metadata use case writes usage only; none says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx
import openai
import orjson
import pytest
import valkey

from gateway.accounting import (
    DECISIONS_STREAM,
    RECORD_FIELDS,
    RECORDS_STREAM,
    USAGE_FIELDS,
    USAGE_STREAM,
)
from ops.processes import wait_until
from testkit.policy import PolicyBuilder
from testkit.stack import RunningGateway
from tests.conftest import GatewayFactory, SimulatorFactory

CHAT = "llama-records"
WHISPER = "whisper-records"
AUDIO = b"RIFF" + bytes(range(256)) * 64


def entries(client: valkey.Valkey, stream: str) -> list[dict[str, bytes]]:
    return [{k.decode(): v for k, v in fields.items()} for _, fields in client.xrange(stream)]


def entry_for(client: valkey.Valkey, stream: str, record_id: str) -> dict[str, bytes]:
    """The one entry of ``stream`` with this record id, once it is there."""

    def found() -> list[dict[str, bytes]]:
        return [e for e in entries(client, stream) if e["record_id"] == record_id.encode()]

    assert wait_until(lambda: len(found()) > 0, timeout=10), f"no {stream} entry {record_id}"
    [entry] = found()
    return entry


def text(entry: dict[str, bytes]) -> dict[str, str]:
    return {k: v.decode() for k, v in entry.items()}


@dataclass
class World:
    gateway: RunningGateway
    valkey: valkey.Valkey
    policy: PolicyBuilder
    alice: str  # full
    bob: str  # metadata
    carol: str  # none

    def post(
        self, key: str, body: dict[str, object], path: str = "/v1/chat/completions"
    ) -> tuple[bytes, httpx.Response]:
        """The exact bytes sent, and the answer."""
        raw = orjson.dumps(body)
        response = httpx.post(
            self.gateway.base_url + path,
            content=raw,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            timeout=30,
        )
        return raw, response

    def sdk(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gateway.base_url + "/v1", api_key=key, max_retries=0)


WorldFactory = Callable[..., World]


@pytest.fixture
def start_world(
    valkey_client: valkey.Valkey, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> WorldFactory:
    chat = start_simulator(CHAT, "--time-scale", "0.01")
    whisper = start_simulator(WHISPER, "--kind", "transcription", "--time-scale", "0")

    def start(configure: Callable[[PolicyBuilder, str], None] | None = None, **env: str) -> World:
        policy = PolicyBuilder()
        policy.model(CHAT, [chat.base_url])
        policy.model(WHISPER, [whisper.base_url], capabilities=("transcription",))
        alice = policy.key(tenant="acme", use_case="assistant")
        bob = policy.key(tenant="acme", use_case="search")
        carol = policy.key(tenant="globex", use_case="batch")
        policy.record(alice, "full").record(bob, "metadata").record(carol, "none")
        if configure is not None:
            configure(policy, alice)
        policy.publish(valkey_client)
        return World(start_gateway(**env), valkey_client, policy, alice, bob, carol)

    return start


def chat_body(content: str = "Tell me about rivers.", **extra: object) -> dict[str, object]:
    return {
        "model": CHAT,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 24,
        **extra,
    }


# --- full --------------------------------------------------------------------------------
def test_a_full_use_cases_plain_chat_is_recorded_as_sent_and_as_answered(start_world) -> None:
    world = start_world()
    sent, response = world.post(world.alice, chat_body())
    assert response.status_code == 200, response.text
    record_id = response.headers["x-switchyard-record-id"]
    assert len(record_id) == 32
    assert int(record_id, 16) >= 0  # hex
    record = entry_for(world.valkey, RECORDS_STREAM, record_id)
    assert sorted(record) == sorted(RECORD_FIELDS)
    assert record["response"] == response.content  # byte for byte as the client read it
    assert record["request"] == sent  # nothing to change: forwarded as sent
    assert record["response_type"] == b"application/json"
    assert record["truncated"] == b"0"
    fields = text({k: v for k, v in record.items() if k in USAGE_FIELDS})
    assert fields["record"] == "full"
    assert fields["endpoint"] == "/v1/chat/completions"
    assert fields["streamed"] == "0"
    assert fields["status"] == "200"
    assert fields["request_id"] == response.headers["x-request-id"]
    usage = text(entry_for(world.valkey, USAGE_STREAM, record_id))
    assert usage["record"] == "full"
    # Either persister may create the row first: the record carries the same usage fields.
    assert {k: usage[k] for k in USAGE_FIELDS} == fields
    assert int(usage["completion_tokens"]) == response.json()["usage"]["completion_tokens"]


def test_a_full_use_cases_stream_is_recorded_as_the_sse_bytes_the_client_read(
    start_world,
) -> None:
    """The gateway asks vLLM for the usage chunk and takes it out again for this client:
    the record holds the stream as the client got it (no usage chunk), and the request as
    forwarded (asking for usage)."""
    world = start_world()
    body = chat_body(stream=True)
    with httpx.stream(
        "POST",
        world.gateway.base_url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {world.alice}"},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        read = b"".join(response.iter_bytes())
        record_id = response.headers["x-switchyard-record-id"]
    assert read.rstrip().endswith(b"data: [DONE]")
    assert b'"usage"' not in read
    record = entry_for(world.valkey, RECORDS_STREAM, record_id)
    assert record["response"] == read
    assert record["response_type"].startswith(b"text/event-stream")
    assert record["streamed"] == b"1"
    assert orjson.loads(record["request"]) == {
        **body,
        "stream_options": {"include_usage": True},
    }
    usage = text(entry_for(world.valkey, USAGE_STREAM, record_id))
    assert (usage["record"], usage["streamed"]) == ("full", "1")
    assert int(usage["completion_tokens"]) > 0


def test_the_openai_sdk_reads_what_the_record_keeps_plain_and_streamed(start_world) -> None:
    world = start_world()
    client = world.sdk(world.alice)
    plain = client.chat.completions.with_raw_response.create(
        model=CHAT, messages=[{"role": "user", "content": "Hello"}], max_tokens=16
    )
    record = entry_for(world.valkey, RECORDS_STREAM, plain.headers["x-switchyard-record-id"])
    assert record["response"] == plain.http_response.content
    assert plain.parse().choices[0].message.content
    with client.chat.completions.with_streaming_response.create(
        model=CHAT,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    ) as streamed:
        read = b"".join(streamed.iter_bytes())
        record_id = streamed.headers["x-switchyard-record-id"]
    record = entry_for(world.valkey, RECORDS_STREAM, record_id)
    assert record["response"] == read
    assert b'"usage"' in read  # the client asked for it: it stays, in the record too
    assert orjson.loads(record["request"])["stream_options"] == {"include_usage": True}


def test_a_refused_request_of_a_full_use_case_records_the_error_body(start_world) -> None:
    """GIVEN alice's use case allows one request a minute WHEN she sends two THEN the second
    is 429, and its record holds the error body she got, joined to the admission decision
    by the record id."""
    world = start_world(lambda policy, alice: policy.use_case_limits(alice, requests_per_minute=1))
    _, first = world.post(world.alice, chat_body())
    assert first.status_code == 200, first.text
    sent, refused = world.post(world.alice, chat_body("Again."))
    assert refused.status_code == 429, refused.text
    record_id = refused.headers["x-switchyard-record-id"]
    assert record_id != first.headers["x-switchyard-record-id"]
    record = entry_for(world.valkey, RECORDS_STREAM, record_id)
    assert record["status"] == b"429"
    assert record["response"] == refused.content
    assert orjson.loads(record["response"])["error"]["code"] == "rate_limit_exceeded"
    assert record["request"] == sent
    decision = text(entry_for(world.valkey, DECISIONS_STREAM, record_id))
    assert decision["decision"] == "rejected"
    assert decision["reason"] == "rate_limit:use case assistant requests per minute"
    assert decision["request_id"] == refused.headers["x-request-id"]


def test_a_transcription_is_recorded_as_a_description_of_the_upload_not_the_audio(
    start_world,
) -> None:
    import hashlib

    world = start_world()
    response = httpx.post(
        world.gateway.base_url + "/v1/audio/transcriptions",
        files={"file": ("call.wav", AUDIO, "audio/wav")},
        data={"model": WHISPER, "language": "en"},
        headers={"authorization": f"Bearer {world.alice}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    record = entry_for(world.valkey, RECORDS_STREAM, response.headers["x-switchyard-record-id"])
    assert AUDIO[:64] not in record["request"]
    assert orjson.loads(record["request"]) == {
        "multipart": True,
        "fields": {"model": WHISPER, "language": "en"},
        "files": {
            "file": {
                "filename": "call.wav",
                "content_type": "audio/wav",
                "size": len(AUDIO),
                "sha256": hashlib.sha256(AUDIO).hexdigest(),
            }
        },
    }
    assert record["response"] == response.content
    assert record["endpoint"] == b"/v1/audio/transcriptions"


def test_a_capture_past_the_limit_keeps_the_first_bytes_and_says_truncated(start_world) -> None:
    world = start_world(SWITCHYARD_RECORD_MAX_CONTENT_BYTES="64")
    sent, response = world.post(world.alice, chat_body("A long question about rivers. " * 10))
    assert response.status_code == 200, response.text
    assert len(response.content) > 64
    record = entry_for(world.valkey, RECORDS_STREAM, response.headers["x-switchyard-record-id"])
    assert record["truncated"] == b"1"
    assert record["request"] == sent[:64]
    assert record["response"] == response.content[:64]
    assert record["record"] == b"full"


def test_a_full_buffer_drops_content_to_metadata_and_never_fails_a_request(start_world) -> None:
    """GIVEN a records buffer of 100 bytes (smaller than any transcript) WHEN alice chats
    THEN every request is answered, the usage says full_dropped, nothing reaches sy:records,
    and the metric counts each drop."""
    world = start_world(SWITCHYARD_RECORD_BUFFER_BYTES="100")
    ids = []
    for n in range(3):
        _, response = world.post(world.alice, chat_body(f"Question {n}"))
        assert response.status_code == 200, response.text
        ids.append(response.headers["x-switchyard-record-id"])
    for record_id in ids:
        assert entry_for(world.valkey, USAGE_STREAM, record_id)["record"] == b"full_dropped"
    assert world.valkey.xlen(RECORDS_STREAM) == 0
    metrics = httpx.get(world.gateway.base_url + "/metrics").text
    assert 'switchyard_gateway_records_content_dropped_total{reason="buffer_bytes"} 3.0' in metrics
    assert 'switchyard_gateway_records_total{record="full_dropped"} 3.0' in metrics
    # One warning for the three (one a period), not one per request.
    log = world.gateway.process.log_text()
    assert log.count("records_content_dropped") == 1, log


# --- metadata and none -------------------------------------------------------------------
@pytest.mark.parametrize(("persona", "kept"), [("bob", "metadata"), ("carol", "none")])
def test_a_use_case_without_full_records_writes_usage_only(start_world, persona, kept) -> None:
    world = start_world()
    _, response = world.post(getattr(world, persona), chat_body())
    assert response.status_code == 200, response.text
    record_id = response.headers["x-switchyard-record-id"]
    usage = text(entry_for(world.valkey, USAGE_STREAM, record_id))
    assert usage["record"] == kept
    assert usage["endpoint"] == "/v1/chat/completions"
    assert usage["streamed"] == "0"
    assert world.valkey.xlen(RECORDS_STREAM) == 0
    metrics = httpx.get(world.gateway.base_url + "/metrics").text
    assert f'switchyard_gateway_records_total{{record="{kept}"}} 1.0' in metrics


def test_a_use_case_the_snapshot_says_nothing_about_keeps_metadata(start_world) -> None:
    def forget(policy: PolicyBuilder, alice: str) -> None:
        del policy.use_cases[str(policy.use_case_id(alice))]["record"]

    world = start_world(forget)
    _, response = world.post(world.alice, chat_body())
    assert response.status_code == 200, response.text
    usage = entry_for(world.valkey, USAGE_STREAM, response.headers["x-switchyard-record-id"])
    assert usage["record"] == b"metadata"


def test_every_forwarded_request_gets_its_own_record_id_even_with_a_repeated_request_id(
    start_world,
) -> None:
    world = start_world()
    ids = set()
    for _ in range(3):
        response = httpx.post(
            world.gateway.base_url + "/v1/chat/completions",
            json=chat_body(),
            headers={"authorization": f"Bearer {world.bob}", "x-request-id": "same-every-time"},
            timeout=30,
        )
        assert response.status_code == 200
        assert response.headers["x-request-id"] == "same-every-time"
        ids.add(response.headers["x-switchyard-record-id"])
    assert len(ids) == 3
    assert wait_until(lambda: len(entries(world.valkey, USAGE_STREAM)) == 3, timeout=10)
    assert {e["record_id"].decode() for e in entries(world.valkey, USAGE_STREAM)} == ids
