"""/v1/files and /v1/batches on the web API, in-process: the input checked line by line, files
scoped to their use case, soft deletes refused while a batch reads the file, the 24 h window
mapped to an SLA class, refusals in OpenAI's error shape. Real Valkey, real API keys, real
storage (the filesystem backend); the SDK through real processes is in
test_openai_batch_sdk.py.

Personas: acme's ``assistant`` use case (key ``alice``) may call llama (chat) and embed
(embeddings); globex's ``elsewhere`` (key ``bob``) may call llama only.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone
from rest_framework.test import APIClient

from governance.audit import Actor
from governance.choices import FileState
from governance.models import (
    ApiFile,
    AuditEvent,
    Deployment,
    FileRegistration,
    Model,
    PriorityClass,
    SlaClass,
)
from scheduler.files.states import (
    file_done,
    file_failed,
    file_queued,
    file_started,
    file_uploaded,
)
from scheduler.files.upload_events import UPLOADS_STREAM, UploadEvent
from testkit.factories import make_key, make_model, make_tenant, make_use_case
from testkit.openai_batch import chat_line, jsonl

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(live_valkey_settings: Any, tmp_path: Path) -> dict[str, Any]:
    live_valkey_settings.STORAGES = {
        **live_valkey_settings.STORAGES,
        "files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "files"), "allow_overwrite": True},
        },
    }
    live_valkey_settings.BATCH_DEFAULT_TOKENS_PER_SECOND = 200.0
    live_valkey_settings.BATCH_MAX_LINES = 5
    llama = make_model("llama", capabilities=["chat"])
    embed = make_model("embed", capabilities=["embeddings"])
    make_model("other", capabilities=["chat"])
    assistant = make_use_case(make_tenant("acme"), "assistant", models=(llama, embed))
    elsewhere = make_use_case(make_tenant("globex"), "elsewhere", models=(llama,))
    day = SlaClass.objects.create(
        use_case=assistant,
        name="day",
        turnaround_seconds=24 * 3600,
        priority_class=PriorityClass.objects.get(name="batch"),
        kinds=["batch"],
    )
    return {
        "alice": key_client(make_key(assistant)[1]),
        "bob": key_client(make_key(elsewhere)[1]),
        "assistant": assistant,
        "day": day,
    }


def key_client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def upload(client: APIClient, content: bytes, purpose: str = "batch") -> Any:
    document = SimpleUploadedFile("requests.jsonl", content, content_type="application/jsonl")
    return client.post("/v1/files", {"file": document, "purpose": purpose}, format="multipart")


def good_input(count: int = 3) -> bytes:
    return jsonl([chat_line(f"req-{n}") for n in range(count)])


def test_an_upload_is_stored_scoped_and_audited(world: dict[str, Any]) -> None:
    answer = upload(world["alice"], good_input())

    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["object"] == "file"
    assert body["purpose"] == "batch"
    assert body["filename"] == "requests.jsonl"
    assert body["bytes"] == len(good_input())
    assert body["status"] == "processed"
    row = ApiFile.objects.get(public_id=body["id"])
    assert row.object_name == f"apifiles/acme/assistant/{body['id']}/requests.jsonl"
    assert row.sha256 == hashlib.sha256(good_input()).hexdigest()
    assert AuditEvent.objects.filter(action="apifile.create", object_id=str(row.pk)).count() == 1
    content = world["alice"].get(f"/v1/files/{body['id']}/content")
    assert b"".join(content.streaming_content) == good_input()
    # Another use case's key learns nothing, not even that it exists.
    for path in (f"/v1/files/{body['id']}", f"/v1/files/{body['id']}/content"):
        refused = world["bob"].get(path)
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "not_found"
    assert world["bob"].get("/v1/files").json()["data"] == []


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([b"not json"], "line 1: not valid JSON"),
        ([b"[1, 2]"], "line 1: not a JSON object"),
        ([chat_line("a"), chat_line("a")], "line 2: custom_id 'a' is used by an earlier line"),
        ([{**chat_line("a"), "method": "GET"}], 'line 1: method must be "POST"'),
        ([{**chat_line("a"), "url": "/v1/images"}], "line 1: url must be one of"),
        ([chat_line("a"), chat_line("b", model="embed")], "line 2: model 'embed' differs"),
        ([chat_line("a", model="other")], "line 1: the use case may not use the model 'other'"),
        ([{**chat_line("a"), "url": "/v1/embeddings"}], "line 1: the model 'llama' does not serve"),
        ([{**chat_line("a"), "body": "hi"}], "line 1: body must be a JSON object"),
        ([chat_line(str(n)) for n in range(6)], "line 6: a batch holds at most 5 requests"),
        ([], "the file holds no requests"),
    ],
)
def test_an_invalid_input_is_refused_naming_the_line(
    world: dict[str, Any], lines: list[Any], message: str
) -> None:
    content = b"".join(line + b"\n" if isinstance(line, bytes) else jsonl([line]) for line in lines)
    answer = upload(world["alice"], content)

    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_batch_input"
    assert error["param"] == "file"
    assert message in error["message"]
    assert not ApiFile.objects.exists()


def test_a_purpose_other_than_batch_is_refused(world: dict[str, Any]) -> None:
    answer = upload(world["alice"], good_input(), purpose="fine-tune")
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "purpose"


def test_requests_without_a_key_are_refused_in_openai_shape(world: dict[str, Any]) -> None:
    answer = APIClient().get("/v1/files")
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "missing_api_key"
    wrong = key_client("sk-sy-not-a-key").get("/v1/batches")
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_api_key"


def test_files_list_pages_and_filters(world: dict[str, Any]) -> None:
    ids = [upload(world["alice"], good_input()).json()["id"] for _ in range(3)]

    newest_first = world["alice"].get("/v1/files", {"limit": 2}).json()
    assert [f["id"] for f in newest_first["data"]] == [ids[2], ids[1]]
    assert newest_first["has_more"] is True
    rest = world["alice"].get("/v1/files", {"limit": 2, "after": ids[1]}).json()
    assert [f["id"] for f in rest["data"]] == [ids[0]]
    assert rest["has_more"] is False
    oldest_first = world["alice"].get("/v1/files", {"order": "asc"}).json()
    assert [f["id"] for f in oldest_first["data"]] == ids
    assert world["alice"].get("/v1/files", {"purpose": "batch_output"}).json()["data"] == []
    assert world["alice"].get("/v1/files", {"limit": 0}).json()["error"]["param"] == "limit"


def test_a_batch_is_registered_on_the_longest_daily_class_and_its_upload_announced(
    world: dict[str, Any], valkey_client: Any
) -> None:
    SlaClass.objects.create(
        use_case=world["assistant"],
        name="hour",
        turnaround_seconds=3600,
        priority_class=PriorityClass.objects.get(name="batch"),
        kinds=["batch"],
    )
    file_id = upload(world["alice"], good_input(3)).json()["id"]

    answer = world["alice"].post(
        "/v1/batches",
        {
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"team": "claims"},
        },
        format="json",
    )

    assert answer.status_code == 200, answer.content
    batch = answer.json()
    registration = FileRegistration.objects.get()
    assert batch["id"] == f"batch_{registration.pk}"
    assert batch["object"] == "batch"
    assert batch["status"] == "validating"
    assert batch["input_file_id"] == file_id
    assert batch["endpoint"] == "/v1/chat/completions"
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    assert batch["metadata"] == {"team": "claims"}
    assert batch["expires_at"] == int(registration.promised_by.timestamp())
    assert registration.sla_class == world["day"]
    assert registration.declared_lines == 3
    assert registration.model.public_id == "llama"
    (entry,) = valkey_client.xrange(UPLOADS_STREAM)
    event = UploadEvent.parse(entry[1])
    assert event.registration_id == registration.pk
    assert event.object_name == ApiFile.objects.get(public_id=file_id).object_name
    # While it runs, its input cannot be deleted.
    refused = world["alice"].delete(f"/v1/files/{file_id}")
    assert refused.status_code == 409
    assert batch["id"] in refused.json()["error"]["message"]

    cancelled = world["alice"].post(f"/v1/batches/{batch['id']}/cancel").json()
    assert cancelled["status"] == "cancelled"
    assert FileRegistration.objects.get().state == FileState.CANCELLED
    deleted = world["alice"].delete(f"/v1/files/{file_id}")
    assert deleted.json() == {"id": file_id, "object": "file", "deleted": True}
    assert world["alice"].get(f"/v1/files/{file_id}").status_code == 404
    assert AuditEvent.objects.filter(action="apifile.delete").count() == 1


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"completion_window": "1h"}, "completion_window"),
        ({"endpoint": "/v1/embeddings"}, "endpoint"),
        ({"endpoint": "/v1/moderations"}, "endpoint"),
        ({"input_file_id": "file-nope"}, "input_file_id"),
        ({"metadata": {str(n): "x" for n in range(17)}}, "metadata"),
    ],
)
def test_a_batch_asked_wrongly_is_refused_on_the_parameter(
    world: dict[str, Any], change: dict[str, Any], param: str
) -> None:
    file_id = upload(world["alice"], good_input()).json()["id"]
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    answer = world["alice"].post("/v1/batches", {**body, **change}, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["param"] == param
    assert not FileRegistration.objects.exists()


def test_without_a_daily_batch_class_the_officer_is_named(world: dict[str, Any]) -> None:
    world["day"].delete()
    file_id = upload(world["alice"], good_input()).json()["id"]
    answer = world["alice"].post(
        "/v1/batches",
        {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        format="json",
    )
    assert answer.status_code == 400
    assert "a governance officer must add one" in answer.json()["error"]["message"]


def test_a_batch_the_fleet_cannot_finish_in_a_day_is_refused_with_the_earliest_time(
    world: dict[str, Any], live_valkey_settings: Any
) -> None:
    # 200 tokens/s, half for batch: 8.64M tokens a day; 5 lines at 10M tokens each cannot fit.
    live_valkey_settings.FILE_TOKENS_PER_LINE = 10_000_000.0
    file_id = upload(world["alice"], good_input(5)).json()["id"]
    answer = world["alice"].post(
        "/v1/batches",
        {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        format="json",
    )
    assert answer.status_code == 409, answer.content
    assert answer.headers["x-should-retry"] == "false"
    error = answer.json()["error"]
    assert error["code"] == "infeasible"
    assert "The earliest completion that could be promised: 20" in error["message"]
    assert not FileRegistration.objects.exists()


def test_batches_are_listed_newest_first_and_hidden_from_other_use_cases(
    world: dict[str, Any],
) -> None:
    file_id = upload(world["alice"], good_input()).json()["id"]
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    ids = [world["alice"].post("/v1/batches", body, format="json").json()["id"] for _ in range(3)]

    page = world["alice"].get("/v1/batches", {"limit": 2}).json()
    assert [b["id"] for b in page["data"]] == [ids[2], ids[1]]
    assert page["has_more"] is True
    rest = world["alice"].get("/v1/batches", {"after": ids[1]}).json()
    assert [b["id"] for b in rest["data"]] == [ids[0]]
    assert world["alice"].get(f"/v1/batches/{ids[0]}").json()["id"] == ids[0]
    assert world["bob"].get(f"/v1/batches/{ids[0]}").status_code == 404
    assert world["bob"].post(f"/v1/batches/{ids[0]}/cancel").status_code == 404
    assert world["bob"].get("/v1/batches").json()["data"] == []
    assert world["alice"].get("/v1/batches/batch_x").status_code == 404


def create_batch(world: dict[str, Any]) -> dict[str, Any]:
    file_id = upload(world["alice"], good_input(3)).json()["id"]
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    answer = world["alice"].post("/v1/batches", body, format="json")
    assert answer.status_code == 200, answer.content
    return dict(answer.json())


def test_the_batch_status_follows_the_registration_through_to_completed(
    world: dict[str, Any],
) -> None:
    batch = create_batch(world)
    registration = FileRegistration.objects.get()
    worker = Actor.system("file-jobs")
    registration = arrived(worker, registration)
    registration = file_queued(actor=worker, registration=registration)
    assert world["alice"].get(f"/v1/batches/{batch['id']}").json()["status"] == "validating"
    registration = file_started(actor=worker, registration=registration)
    running = world["alice"].get(f"/v1/batches/{batch['id']}").json()
    assert running["status"] == "in_progress"
    assert running["in_progress_at"] == int(registration.state_changed_at.timestamp())
    started = running["in_progress_at"]

    FileRegistration.objects.filter(pk=registration.pk).update(
        counts={"total": 3, "completed": 2, "failed": 1}
    )
    registration.refresh_from_db()
    registration = file_done(
        actor=worker,
        registration=registration,
        outputs={"output_file_id": "file-out", "error_file_id": "file-err"},
    )

    for done in (
        world["alice"].get(f"/v1/batches/{batch['id']}").json(),
        world["alice"].get("/v1/batches").json()["data"][0],
    ):
        assert done["status"] == "completed"
        assert done["in_progress_at"] == started
        assert done["completed_at"] == int(registration.state_changed_at.timestamp())
        assert (done["output_file_id"], done["error_file_id"]) == ("file-out", "file-err")
        assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
        assert done["errors"] is None
    refused = world["alice"].post(f"/v1/batches/{batch['id']}/cancel")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "conflict"


def test_a_failed_batch_says_why_and_a_running_one_answers_cancelling(
    world: dict[str, Any],
) -> None:
    worker = Actor.system("file-jobs")
    failing, cancelled = create_batch(world), create_batch(world)
    first, second = FileRegistration.objects.order_by("pk")
    for registration in (first, second):
        registration = arrived(worker, registration)
        registration = file_queued(actor=worker, registration=registration)
        file_started(actor=worker, registration=registration)
    file_failed(actor=worker, registration=first, failure="line 2 of the input is not JSON")

    failed = world["alice"].get(f"/v1/batches/{failing['id']}").json()
    assert failed["status"] == "failed"
    assert failed["failed_at"] is not None
    assert failed["errors"]["data"][0]["message"] == "line 2 of the input is not JSON"
    answer = world["alice"].post(f"/v1/batches/{cancelled['id']}/cancel").json()
    assert answer["status"] == "cancelling"
    assert world["alice"].get(f"/v1/batches/{cancelled['id']}").json()["status"] == "cancelled"


def test_a_file_over_the_size_bound_is_refused_before_it_is_read(
    world: dict[str, Any], live_valkey_settings: Any
) -> None:
    live_valkey_settings.BATCH_MAX_FILE_BYTES = 100
    big = jsonl([chat_line(str(n), text="x" * 1000) for n in range(80)])  # > 64 KiB framing
    too_big = upload(world["alice"], big)
    assert too_big.status_code == 413
    assert too_big.json()["error"]["code"] == "file_too_large"
    over = upload(world["alice"], good_input())  # over 100 bytes, within the framing allowance
    assert over.status_code == 400
    assert over.json()["error"] == {
        "message": "The file is larger than 100 bytes.",
        "type": "invalid_request_error",
        "param": "file",
        "code": None,
    }
    assert not ApiFile.objects.exists()


@pytest.mark.parametrize(
    ("sent", "stored"),
    [("../../etc/passwd", "passwd"), ("...", "input.jsonl"), ("a b?.jsonl", "a_b_.jsonl")],
)
def test_the_object_name_keeps_only_a_safe_last_segment(
    world: dict[str, Any], sent: str, stored: str
) -> None:
    document = SimpleUploadedFile("x", good_input())
    document.name = sent
    answer = world["alice"].post(
        "/v1/files", {"file": document, "purpose": "batch"}, format="multipart"
    )
    assert answer.status_code == 200, answer.content
    row = ApiFile.objects.get()
    assert row.object_name == f"apifiles/acme/assistant/{row.public_id}/{stored}"


def arrived(worker: Actor, registration: FileRegistration) -> FileRegistration:
    """What the upload consumer records for a batch: its input file is the object."""
    assert registration.input_file is not None
    return file_uploaded(
        actor=worker,
        registration=registration,
        uploaded_at=timezone.now(),
        source_object=registration.input_file.object_name,
        source_bytes=registration.input_file.bytes,
        source_sha256=registration.input_file.sha256,
    )


def test_a_line_may_name_a_version_or_an_alias_of_a_model_the_use_case_may_use(
    world: dict[str, Any],
) -> None:
    """GIVEN llama with versions v1 and v2 and the alias stable, and 'other' the use case
    may not use WHEN batches name llama@stable, llama@v2, other@v1 or llama@v9 THEN the first
    two are accepted and become a batch; the others are refused naming the line."""
    llama = Model.objects.get(public_id="llama")
    llama.deployments.update(version="v1")
    Deployment.objects.create(model=llama, served_name="llama", replicas=["http://127.0.0.1:9"],
                              version="v2")  # fmt: skip
    llama.routing = {"split": {"v1": 100}, "aliases": {"stable": "v1"}}
    llama.full_clean()
    llama.save()
    for name in ("llama@stable", "llama@v2"):
        answer = upload(world["alice"], jsonl([chat_line("a", model=name)]))
        assert answer.status_code == 200, (name, answer.content)
    batch = world["alice"].post(
        "/v1/batches",
        {
            "input_file_id": answer.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
        format="json",
    )
    assert batch.status_code == 200, batch.content
    for name in ("other@v1", "llama@v9"):
        refused = upload(world["alice"], jsonl([chat_line("a", model=name)]))
        assert refused.status_code == 400, (name, refused.content)
        assert (
            f"line 1: the use case may not use the model '{name}'"
            in (refused.json()["error"]["message"])
        )
