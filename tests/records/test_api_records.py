"""/api/records/: the search in a fixed number of queries, one transcript with its content
from real object storage (audited), a tampered object, exports by ``?format=`` and the cap.
Who may call what is in tests/governance/test_authorization_matrix.py."""

from __future__ import annotations

import csv
import hashlib
import io
from typing import Any

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from governance.models import AuditEvent, UseCase
from governance.roles import Role
from records.models import InteractionRecord
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


@pytest.fixture
def chatbot(records_store: RecordsStore) -> UseCase:
    return make_use_case(make_tenant("acme"), "chatbot", record_policy="full")


@pytest.fixture
def audrey() -> APIClient:
    client = APIClient()
    user: Any = make_user("audrey", Role.AUDITOR)
    client.force_authenticate(user)
    return client


def test_the_search_is_paginated_newest_first_in_a_fixed_number_of_queries(
    chatbot: UseCase, audrey: APIClient, django_assert_max_num_queries: Any
) -> None:
    key, _ = make_key(chatbot, name="checkout")
    made = [make_record(chatbot, minutes=n, key_id=key.pk) for n in range(30)]
    with django_assert_max_num_queries(10):
        response = audrey.get("/api/records/", {"use_case": chatbot.pk})
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 30
    assert [r["record_id"] for r in body["results"]] == [r.record_id for r in reversed(made)]
    first = body["results"][0]
    assert first["use_case"] == "acme/chatbot"
    assert first["key_name"] == "checkout"
    assert first["key_prefix"] == key.prefix
    assert first["content"] == "none"


def test_a_transcript_with_content_is_read_from_object_storage_and_audited(
    chatbot: UseCase, audrey: APIClient
) -> None:
    streamed = make_record(chatbot, streamed=True, request_id="req-s")
    store_content([(streamed, chat_request("Count", stream=True), sse_response("One, ", "two."))])

    response = audrey.get(f"/api/records/{streamed.record_id}/")

    assert response.status_code == 200
    body = response.json()
    assert body["record"]["record_id"] == streamed.record_id
    assert body["record"]["request_id"] == "req-s"
    assert body["content"]["request"] == chat_request("Count", stream=True).decode()
    assert body["content"]["response"] == sse_response("One, ", "two.").decode()
    assert body["content"]["response_type"] == "text/event-stream"
    assert body["content_problem"] == ""
    assert body["assembled"]["choices"][0]["text"] == "One, two."
    assert body["assembled"]["done"] is True
    (viewed,) = AuditEvent.objects.filter(action="records.viewed")
    assert viewed.actor == "audrey"
    assert viewed.after is not None
    assert viewed.after["record_id"] == streamed.record_id


def test_a_tampered_object_gives_no_content_and_says_why(
    chatbot: UseCase, audrey: APIClient, records_store: RecordsStore
) -> None:
    record = make_record(chatbot)
    stored = store_content([(record, chat_request("secret"), chat_response("classified"))])
    s3 = records_store.client()
    s3.put_object(Bucket=records_store.bucket, Key=stored.key, Body=b"SYSEAL1\nnot it")

    body = audrey.get(f"/api/records/{record.record_id}/").json()

    assert body["content"] is None
    assert body["content_problem"].startswith("The content cannot be verified: object")
    assert "classified" not in str(body)


def test_exports_by_format_parameter_and_the_cap(chatbot: UseCase, audrey: APIClient) -> None:
    kept = make_record(chatbot, minutes=1)
    store_content([(kept, chat_request("q"), chat_response("a, with a comma\nand a newline"))])
    make_record(chatbot, minutes=0, status=503)

    response: Any = audrey.get("/api/records/export/", {"format": "csv", "status": "2xx"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    body = b"".join(response.streaming_content)
    (row,) = csv.DictReader(io.StringIO(body.decode()))
    assert row["record_id"] == kept.record_id
    assert row["response"] == chat_response("a, with a comma\nand a newline").decode()
    exported = AuditEvent.objects.get(action="records.exported")
    assert exported.after == {
        "filter": {"status": "2xx"},
        "format": "csv",
        "records": 1,
        "sha256": hashlib.sha256(body).hexdigest(),
        "complete": True,
        "started": AuditEvent.objects.get(action="records.export_started").sequence,
    }

    with override_settings(RECORDS_EXPORT_MAX_RECORDS=1):
        refused = audrey.get("/api/records/export/", {"format": "jsonl"})
    assert refused.status_code == 400
    assert "holds 2 records; an export holds at most 1" in refused.json()["detail"][0]
    assert audrey.get("/api/records/export/", {"format": "xml"}).status_code == 400
    assert InteractionRecord.objects.count() == 2
    assert AuditEvent.objects.filter(action="records.exported").count() == 1
