"""Reads are audited when they happen, before a byte of the body is sent, so a download cut
short is on the trail too (issue 24, defect 10): ``/v1/files/{id}/content`` (a batch input or
a batch's output), an async task's result opened from "My work", and a records export (its
start with the filter, its end with the count).

Personas: acme's ``assistant`` use case, whose program holds a key; alice, a developer of
acme; bob, a developer of globex; audrey, an auditor. Real Valkey (the task store), real
keys, real storage (the filesystem backend), real records rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import valkey
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.signals import request_finished
from django.db import close_old_connections
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from gateway.async_tasks import layout
from governance.models import ApiFile, AuditEvent, FileRegistration, PriorityClass, SlaClass
from governance.roles import Role
from scheduler.files.openai_files import batch_result_file
from testkit.async_tasks import now_ms, submit
from testkit.factories import make_key, make_model, make_tenant, make_use_case, make_user
from testkit.openai_batch import chat_line, jsonl
from testkit.records import make_record

pytestmark = pytest.mark.django_db

OUTPUT = b'{"id": "batch_req_1", "custom_id": "req-0", "response": {"status_code": 200}}\n'


@pytest.fixture
def live_valkey_settings(settings: Any, valkey_url: str, valkey_client: valkey.Valkey) -> Any:
    """The Django side on the test Valkey (flushed by valkey_client)."""
    settings.VALKEY_URL = valkey_url
    return settings


@pytest.fixture
def files_settings(live_valkey_settings: Any, tmp_path: Path) -> Any:
    live_valkey_settings.STORAGES = {
        **live_valkey_settings.STORAGES,
        "files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "files"), "allow_overwrite": True},
        },
    }
    live_valkey_settings.BATCH_DEFAULT_TOKENS_PER_SECOND = 200.0
    return live_valkey_settings


def key_client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def go_away(response: Any) -> None:
    """The client leaves before reading a byte: the server closes the response (as a WSGI or
    ASGI server does on a disconnect). Closing signals ``request_finished``; like Django's
    test client, keep the test's database connection open through it."""
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)


def person(name: str, role: Role, *tenants: Any) -> Client:
    client = Client()
    client.force_login(make_user(name, role, tenants=tenants))  # type: ignore[arg-type]
    return client


# --- /v1/files/{id}/content ------------------------------------------------------------------


def test_a_file_content_download_is_audited_before_its_body_is_sent(files_settings: Any) -> None:
    """GIVEN the use case's key, its uploaded batch input and a batch's output file
    WHEN the key asks for each file's content and goes away before reading a byte
    THEN each download is already on the trail: the key, the file, its tenant, its size."""
    llama = make_model("llama", capabilities=["chat"])
    assistant = make_use_case(make_tenant("acme"), "assistant", models=(llama,))
    SlaClass.objects.create(
        use_case=assistant,
        name="day",
        turnaround_seconds=24 * 3600,
        priority_class=PriorityClass.objects.get(name="batch"),
        kinds=["batch"],
    )
    key, secret = make_key(assistant)
    program = key_client(secret)
    content = jsonl([chat_line("req-0")])
    document = SimpleUploadedFile("requests.jsonl", content)
    uploaded = program.post("/v1/files", {"file": document, "purpose": "batch"}, format="multipart")
    assert uploaded.status_code == 200, uploaded.content
    batch = program.post(
        "/v1/batches",
        {
            "input_file_id": uploaded.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
        format="json",
    )
    assert batch.status_code == 200, batch.content
    registration = FileRegistration.objects.get()
    object_name = storages["files"].save(
        f"outputs/{registration.pk}/results.jsonl", ContentFile(OUTPUT)
    )
    output_id = batch_result_file(
        registration_id=registration.pk,
        purpose="batch_output",
        object_name=object_name,
        content=OUTPUT,
    )

    for public_id, size in ((uploaded.json()["id"], len(content)), (output_id, len(OUTPUT))):
        file = ApiFile.objects.get(public_id=public_id)
        answer: Any = program.get(f"/v1/files/{public_id}/content")
        assert answer.status_code == 200
        go_away(answer)  # not one chunk of the body was pulled

        event = AuditEvent.objects.get(action="apifile.download", object_id=str(file.pk))
        assert event.actor == f"key:{key.prefix}"
        assert event.object_type == "governance.apifile"
        assert event.tenant_slug == "acme"
        assert event.tenant_id == assistant.tenant_id
        assert event.after == {
            "file": public_id,
            "purpose": file.purpose,
            "object": file.object_name,
            "bytes": size,
        }

    # A read of the whole file is one event too, and the bytes are the file's.
    again: Any = program.get(f"/v1/files/{output_id}/content")
    assert b"".join(again.streaming_content) == OUTPUT
    assert AuditEvent.objects.filter(action="apifile.download").count() == 3


# --- "My work": an async task's result ----------------------------------------------------


def finish(client: valkey.Valkey, task_id: str, result: dict[str, Any]) -> None:
    """End the task as the batcher does (scheduler/batcher/worker.py ``_done``)."""
    client.hset(
        layout.task(task_id),
        mapping={
            "status": "done",
            "result": orjson.dumps(result).decode(),
            "status_code": 200,
            "finished_ms": now_ms(),
        },
    )


def test_an_async_result_opened_from_my_work_is_audited(
    live_valkey_settings: Any, valkey_client: valkey.Valkey
) -> None:
    """GIVEN a done task and a queued one of acme's use case
    WHEN alice opens the done task's result from My work, then the queued task, and bob
    (globex) asks for alice's result
    THEN the result she read is on the trail (alice, the task, acme); the queued task holds no
    result to read and leaves none; bob's 404 read nothing and leaves none."""
    acme = make_tenant("acme")
    search = make_use_case(acme, "search")
    alice = person("alice", Role.DEVELOPER, acme)
    bob = person("bob", Role.DEVELOPER, make_tenant("globex"))
    body = {"input": "claim one"}
    done = submit(
        valkey_client, model="embed", endpoint="/v1/embeddings", body=body, use_case_id=search.pk
    )
    finish(valkey_client, done, {"object": "list", "data": [{"embedding": [0.5]}]})
    queued = submit(
        valkey_client, model="embed", endpoint="/v1/embeddings", body=body, use_case_id=search.pk
    )

    answer = alice.get(reverse("portal:my_work_task", args=[done]))
    assert answer.status_code == 200
    assert answer.json()["result"]["data"][0]["embedding"] == [0.5]
    (event,) = AuditEvent.objects.filter(action="async_task.read")
    assert event.actor == "alice"
    assert event.tenant_slug == "acme"
    assert event.tenant_id == acme.pk
    assert event.object_repr == f"async task {done}"
    assert event.after == {
        "task": done,
        "use_case_id": search.pk,
        "status": "done",
        "model": "embed",
        "endpoint": "/v1/embeddings",
    }

    assert alice.get(reverse("portal:my_work_task", args=[queued])).status_code == 200
    assert bob.get(reverse("portal:my_work_task", args=[done])).status_code == 404
    assert AuditEvent.objects.filter(action="async_task.read").count() == 1


# --- records exports ------------------------------------------------------------------------


@pytest.mark.parametrize("door", ["api", "portal"])
def test_a_records_export_is_audited_when_it_starts_and_when_it_ends(door: str) -> None:
    """GIVEN three records of acme's chatbot, two of them answered 2xx
    WHEN audrey exports the 2xx ones and goes away before a byte, then exports them again to
    the end
    THEN each export's start is on the trail with its filter, format and the records it will
    hold; each one's end says how many were sent (none for the first), pointing at its
    start."""
    acme = make_tenant("acme")
    chatbot = make_use_case(acme, "chatbot")
    make_record(chatbot, minutes=1)
    make_record(chatbot, minutes=2)
    make_record(chatbot, minutes=3, status=503)
    audrey = person("audrey", Role.AUDITOR)
    url = "/api/records/export/" if door == "api" else reverse("portal:records_export")
    wanted = {"format": "jsonl", "status": "2xx", "tenant": "acme"}

    cut: Any = audrey.get(url, wanted)
    assert cut.status_code == 200
    go_away(cut)  # not one chunk pulled

    (started,) = AuditEvent.objects.filter(action="records.export_started")
    assert started.actor == "audrey"
    assert started.tenant_slug == "acme"
    assert started.tenant_id == acme.pk
    assert started.after == {
        "filter": {"status": "2xx", "tenant": "acme"},
        "format": "jsonl",
        "records": 2,
    }

    # Gone before a byte: its end is on the trail too, with nothing sent.
    (cut_short,) = AuditEvent.objects.filter(action="records.exported")
    assert cut_short.after is not None
    assert cut_short.after["records"] == 0
    assert cut_short.after["complete"] is False
    assert cut_short.after["started"] == started.sequence

    whole: Any = audrey.get(url, wanted)
    lines = b"".join(whole.streaming_content).splitlines()
    assert len(lines) == 2
    second = AuditEvent.objects.filter(action="records.export_started").latest("sequence")
    assert second.pk != started.pk
    ended = AuditEvent.objects.filter(action="records.exported").latest("sequence")
    assert ended.sequence > second.sequence
    assert ended.tenant_slug == "acme"
    assert ended.after is not None
    assert ended.after["records"] == 2
    assert ended.after["complete"] is True
    assert ended.after["started"] == second.sequence
