"""The records pages: search, one transcript read from real object storage (SeaweedFS), a
tampered object, streamed exports (WSGI and ASGI) and their audit events, the export cap.

Personas: audrey is an auditor, alice a developer of acme, bob a developer of globex.
"""

from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import dataclass
from html import unescape
from typing import Any

import orjson
import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client
from django.test.utils import override_settings

from governance.audit import Actor
from governance.models import AuditEvent, UseCase
from governance.roles import Role
from records import reading as record_reading
from records.models import AdmissionDecision, GuardrailFinding, InteractionRecord
from records.reading import exports as record_exports
from testkit.factories import make_key, make_tenant, make_use_case, make_user
from testkit.records import (
    chat_request,
    chat_response,
    make_record,
    sse_response,
    store_content,
)
from testkit.records_store import RecordsStore

pytestmark = pytest.mark.django_db


@dataclass
class World:
    chatbot: UseCase
    plain: InteractionRecord
    streamed: InteractionRecord
    metadata_only: InteractionRecord
    audrey: Client


@pytest.fixture
def world(records_store: RecordsStore) -> World:
    """acme's chatbot (policy full) with a plain and a streamed chat stored in SeaweedFS, and
    one metadata-only record."""
    acme = make_tenant("acme")
    chatbot = make_use_case(acme, "chatbot", record_policy="full")
    key, _ = make_key(chatbot, name="checkout-service")
    plain = make_record(chatbot, minutes=1, key_id=key.pk, request_id="req-plain")
    streamed = make_record(chatbot, minutes=2, key_id=key.pk, streamed=True)
    metadata_only = make_record(chatbot, minutes=3, status=429)
    store_content(
        [
            (plain, chat_request("What is the refund policy?"), chat_response("30 days, Sir.")),
            (
                streamed,
                chat_request("Count to three", stream=True),
                sse_response("One, ", "two, ", "three."),
            ),
        ]
    )
    audrey = Client()
    audrey.force_login(_user("audrey", Role.AUDITOR))
    return World(chatbot, plain, streamed, metadata_only, audrey)


def _body(response: Any) -> bytes:
    return b"".join(response.streaming_content)


def _text(response: Any) -> str:
    return unescape(response.content.decode())


def _events(action: str) -> list[Any]:
    return list(AuditEvent.objects.filter(action=action).order_by("sequence"))


def _user(username: str, *roles: Role, **kwargs: Any) -> Any:
    return make_user(username, *roles, **kwargs)


# --- search -----------------------------------------------------------------------------------
def test_the_search_lists_records_newest_first_with_the_count(world: World) -> None:
    response: Any = world.audrey.get("/records/")
    assert response.status_code == 200
    page = _text(response)
    assert 'id="record-count">3<' in page
    ids = [world.metadata_only.record_id, world.streamed.record_id, world.plain.record_id]
    positions = [page.index(f"/records/{record_id}/") for record_id in ids]
    assert positions == sorted(positions)
    assert "checkout-service" in page  # the key's name, looked up once per page

    narrowed = _text(world.audrey.get("/records/", {"status": "4xx"}))
    assert world.metadata_only.record_id in narrowed
    assert world.plain.record_id not in narrowed


def test_the_search_page_makes_a_fixed_number_of_queries(
    world: World, django_assert_max_num_queries: Any
) -> None:
    for minute in range(10, 30):
        make_record(world.chatbot, minutes=minute)
    with django_assert_max_num_queries(12):
        assert world.audrey.get("/records/").status_code == 200


# --- one transcript ----------------------------------------------------------------------------
def test_an_auditor_reads_a_transcript_from_object_storage_and_the_read_is_audited(
    world: World,
) -> None:
    AdmissionDecision.objects.create(
        stream_id="9-0",
        request_id="req-plain",
        record_id=world.plain.record_id,
        occurred_at=world.plain.occurred_at,
        decision="queued",
        tenant="acme",
        tenant_id=world.chatbot.tenant_id,
        use_case_id=world.chatbot.pk,
        model="llama",
        queued_ms=250,
    )
    GuardrailFinding.objects.create(
        stream_id="9-1",
        request_id="req-plain",
        record_id=world.plain.record_id,
        occurred_at=world.plain.occurred_at,
        tenant="acme",
        use_case_id=world.chatbot.pk,
        model="llama",
        stage="response",
        guardrail="pii",
        action="redacted",
        entities={"EMAIL": 2},
    )

    response: Any = world.audrey.get(f"/records/{world.plain.record_id}/")

    assert response.status_code == 200
    page = _text(response)
    assert "What is the refund policy?" in page
    assert "30 days, Sir." in page
    assert "http://10.0.0.7:8000" in page  # the replica
    assert "queued 5 ms, upstream 120 ms, total 130 ms" in page
    assert "checkout-service" in page
    assert 'id="record-decisions"' in page
    assert "250 ms" in page
    assert 'id="record-findings"' in page
    assert "EMAIL" in page
    (viewed,) = _events("records.viewed")
    assert viewed.actor == "audrey"
    assert viewed.tenant_slug == "acme"
    assert viewed.tenant_id == world.chatbot.tenant_id
    assert viewed.after == {
        "record_id": world.plain.record_id,
        "request_id": "req-plain",
        "use_case_id": world.chatbot.pk,
        "use_case": "acme/chatbot",
        "tenant": "acme",
        "verified": True,
    }


def test_a_streamed_transcript_shows_the_assembled_message(world: World) -> None:
    page = _text(world.audrey.get(f"/records/{world.streamed.record_id}/"))
    assert "assembled from 4 streamed chunks" in page
    assert '<pre class="wrap">One, two, three.</pre>' in page
    assert "data: [DONE]" in page  # and the bytes as the client received them


def test_a_metadata_only_record_shows_no_content_and_is_not_a_content_read(world: World) -> None:
    page = _text(world.audrey.get(f"/records/{world.metadata_only.record_id}/"))
    assert "keeps metadata only" in page
    assert _events("records.viewed") == []


def test_a_tampered_object_cannot_be_verified_and_its_text_is_not_shown(
    world: World, records_store: RecordsStore
) -> None:
    """GIVEN the stored object's bytes changed in the bucket behind Switchyard's back
    WHEN an auditor opens a transcript held in it
    THEN the page says the content cannot be verified and shows none of it."""
    assert world.plain.object is not None
    s3 = records_store.client()
    key = world.plain.object.key
    sealed = bytearray(s3.get_object(Bucket=records_store.bucket, Key=key)["Body"].read())
    sealed[-5] ^= 0x01
    s3.put_object(Bucket=records_store.bucket, Key=key, Body=bytes(sealed))

    page = _text(world.audrey.get(f"/records/{world.plain.record_id}/"))

    assert 'id="content-problem"' in page
    assert "The content cannot be verified: object" in page
    assert "differs from the checksum recorded" in page
    assert "refund policy" not in page
    (viewed,) = _events("records.viewed")
    assert viewed.after["verified"] is False


def test_a_missing_object_cannot_be_verified(world: World, records_store: RecordsStore) -> None:
    assert world.plain.object is not None
    records_store.client().delete_object(Bucket=records_store.bucket, Key=world.plain.object.key)
    page = _text(world.audrey.get(f"/records/{world.plain.record_id}/"))
    assert "The content cannot be verified: object" in page
    assert "could not be read" in page


def test_a_line_swapped_for_another_records_fails_its_checksum(world: World) -> None:
    world.plain.line = 1  # points at the streamed record's line
    world.plain.save()
    page = _text(world.audrey.get(f"/records/{world.plain.record_id}/"))
    assert "differs from its checksum" in page
    assert "One, " not in page


# --- exports -----------------------------------------------------------------------------------
def _expected_rows(world: World) -> list[dict[str, Any]]:
    """What an export of the world must hold, newest first, built from the fixture's inputs."""
    rows = []
    for record, content in (
        (world.metadata_only, None),
        (
            world.streamed,
            (chat_request("Count to three", stream=True), sse_response("One, ", "two, ", "three.")),
        ),
        (world.plain, (chat_request("What is the refund policy?"), chat_response("30 days, Sir."))),
    ):
        record.refresh_from_db()
        row: dict[str, Any] = {
            name: getattr(record, name) for name in record_reading.EXPORT_COLUMNS
        }
        row["occurred_at"] = record.occurred_at.isoformat()
        if content is not None:
            row.update(
                request=content[0].decode(),
                request_encoding="utf-8",
                response=content[1].decode(),
                response_encoding="utf-8",
                response_type="text/event-stream" if record.streamed else "application/json",
            )
        rows.append(row)
    return rows


def test_a_jsonl_export_is_streamed_holds_the_records_and_is_audited(world: World) -> None:
    response: Any = world.audrey.get("/records/export/", {"format": "jsonl"})

    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Type"] == "application/jsonl"
    assert response["Content-Disposition"].startswith('attachment; filename="switchyard-records-')
    body = b"".join(response.streaming_content)
    assert [orjson.loads(line) for line in body.splitlines()] == _expected_rows(world)
    (exported,) = _events("records.exported")
    assert exported.actor == "audrey"
    assert exported.after == {
        "filter": {},
        "format": "jsonl",
        "records": 3,
        "sha256": hashlib.sha256(body).hexdigest(),
        "complete": True,
        "started": _events("records.export_started")[0].sequence,
    }


def test_a_csv_export_has_the_content_as_text_columns(world: World) -> None:
    response: Any = world.audrey.get("/records/export/", {"format": "csv", "status": "2xx"})

    assert response.streaming
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    body = b"".join(response.streaming_content)
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    expected = [row for row in _expected_rows(world) if row["status"] == 200]
    assert [row["record_id"] for row in rows] == [row["record_id"] for row in expected]
    assert [row["response"] for row in rows] == [row["response"] for row in expected]
    assert [row["request"] for row in rows] == [row["request"] for row in expected]
    assert rows[0]["streamed"] == "True"
    assert rows[0]["status"] == "200"
    (exported,) = _events("records.exported")
    assert exported.after["filter"] == {"status": "2xx"}
    assert exported.after["records"] == 2
    assert exported.after["sha256"] == hashlib.sha256(body).hexdigest()


def test_under_asgi_the_export_is_an_async_stream_pulled_chunk_by_chunk(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GIVEN the web process's ASGI handler WHEN an auditor exports
    THEN the response is an async stream (Django would buffer a sync one whole), one chunk
    per few records, and the bytes and the audit event are the same as under WSGI."""
    monkeypatch.setattr(record_exports, "EXPORT_CHUNK_ROWS", 1)
    user = _user("audrey2", Role.AUDITOR)

    async def export() -> tuple[Any, list[bytes]]:
        client = AsyncClient()
        await client.aforce_login(user)
        response: Any = await client.get("/records/export/", {"format": "jsonl"})
        chunks = [chunk async for chunk in response.streaming_content]
        return response, chunks

    response, chunks = async_to_sync(export)()

    assert response.status_code == 200
    assert response.streaming
    assert response.is_async
    assert len(chunks) == 3  # one record per chunk: pulled one at a time
    body = b"".join(chunks)
    assert [orjson.loads(line) for line in body.splitlines()] == _expected_rows(world)
    (exported,) = _events("records.exported")
    assert exported.actor == "audrey2"
    assert exported.after["records"] == 3
    assert exported.after["sha256"] == hashlib.sha256(body).hexdigest()
    assert exported.after["complete"] is True


def test_an_export_cut_short_is_audited_as_such(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GIVEN an export streaming one record per chunk WHEN the client goes away after the
    first chunk (the server closes the generator) THEN its audit event says how far it got."""
    monkeypatch.setattr(record_exports, "EXPORT_CHUNK_ROWS", 1)
    chunks = record_reading.records_export(
        actor=Actor.system("tests"),
        rows=InteractionRecord.objects.order_by("-occurred_at"),
        fmt="jsonl",
        described={"status": "2xx"},
        expected=3,
    )
    first = next(chunks)
    chunks.close()

    (exported,) = _events("records.exported")
    assert exported.after == {
        "filter": {"status": "2xx"},
        "format": "jsonl",
        "records": 1,
        "sha256": hashlib.sha256(first).hexdigest(),
        "complete": False,
        "started": _events("records.export_started")[0].sequence,
    }


def test_a_selection_beyond_the_cap_is_refused_before_it_starts(world: World) -> None:
    with override_settings(RECORDS_EXPORT_MAX_RECORDS=2):
        response: Any = world.audrey.get("/records/export/", {"format": "csv"})
        assert response.status_code == 400
        assert not response.streaming
        assert "holds 3 records; an export holds at most 2" in _text(response)
        narrowed: Any = world.audrey.get("/records/export/", {"format": "csv", "status": "200"})
        assert narrowed.status_code == 200
        b"".join(narrowed.streaming_content)
    assert len(_events("records.exported")) == 1


def test_an_unknown_format_is_a_clear_400(world: World) -> None:
    response: Any = world.audrey.get("/records/export/", {"format": "xlsx"})
    assert response.status_code == 400
    assert "Choose a format: jsonl, csv." in _text(response)
    assert _events("records.exported") == []


def test_a_developer_exports_only_the_records_open_to_them(
    world: World, records_store: RecordsStore
) -> None:
    """alice (acme) reads chatbot's records once the use case opens them to developers; a
    second acme use case that does not open them stays out of her export."""
    hr = make_use_case(world.chatbot.tenant, "hr-bot", record_policy="full")
    hidden = make_record(hr, minutes=5)
    alice = Client()
    alice.force_login(_user("alice", Role.DEVELOPER, tenants=(world.chatbot.tenant,)))

    assert _body(alice.get("/records/export/")) == b""
    UseCase.objects.filter(pk=world.chatbot.pk).update(records_visible_to_developers=True)
    body = _body(alice.get("/records/export/"))

    ids = [orjson.loads(line)["record_id"] for line in body.splitlines()]
    assert ids == [r["record_id"] for r in _expected_rows(world)]
    assert hidden.record_id not in ids
    plain = [orjson.loads(line) for line in body.splitlines()][-1]
    assert plain["response"] == chat_response("30 days, Sir.").decode()  # content, where kept
    assert alice.get(f"/records/{hidden.record_id}/").status_code == 404
