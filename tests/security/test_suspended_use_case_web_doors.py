"""Every door of the web process that takes an API key refuses the key once it may no longer
act: its use case suspended or retired, the key revoked or past its expiry (issue 24, defect 6).

The gateway refuses such a key because the policy snapshot leaves it out (governance/
snapshot.py): 401, ``invalid_api_key``, "Incorrect API key provided.". The web process answers
the same on its OpenAI doors (/v1/files, /v1/batches) and a DRF-shaped 401 on /api/files/, from
one place: the API-key authentication class.

Personas: acme's ``assistant`` use case, whose program holds the key ``alice``; olivia is a
governance officer who suspends or retires it. Real Valkey, real keys, real storage (the
filesystem backend); a service-account token from a real OIDC provider process.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from governance.audit import Actor
from governance.models import ApiFile, ApiKey, FileRegistration, PriorityClass, SlaClass, UseCase
from governance.roles import Role
from governance.services.api_keys import api_key_revoke
from governance.services.use_cases import use_case_transition
from scheduler.files.openai_files import batch_result_file
from testkit.factories import make_key, make_model, make_tenant, make_use_case, make_user
from testkit.oidc import (
    AUTOMATION_CLIENT,
    Provider,
    settings_from_environment,
)
from testkit.openai_batch import chat_line, jsonl

pytestmark = pytest.mark.django_db

OUTPUT = b'{"id": "batch_req_1", "custom_id": "req-0"}\n'


@dataclass
class World:
    use_case: UseCase
    key: ApiKey
    alice: APIClient
    file_id: str  # an uploaded batch input
    output_id: str  # a batch's output file
    batch_id: str  # the batch, "batch_<registration id>"
    registration: FileRegistration
    olivia: Actor


def key_client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def live_valkey_settings(settings: Any, valkey_url: str, valkey_client: Any) -> Any:
    """The Django side on the test Valkey (flushed by valkey_client)."""
    settings.VALKEY_URL = valkey_url
    return settings


def _files_storage(settings: Any, tmp_path: Path) -> None:
    settings.STORAGES = {
        **settings.STORAGES,
        "files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "files"), "allow_overwrite": True},
        },
    }


def _day_class(use_case: UseCase) -> SlaClass:
    return SlaClass.objects.create(
        use_case=use_case,
        name="day",
        turnaround_seconds=24 * 3600,
        priority_class=PriorityClass.objects.get(name="batch"),
        kinds=["batch"],
    )


@pytest.fixture
def world(live_valkey_settings: Any, tmp_path: Path) -> World:
    """GIVEN an approved use case whose key has uploaded a batch input, created a batch, and
    whose batch has an output both as an OpenAI file and as a registration's output."""
    _files_storage(live_valkey_settings, tmp_path)
    live_valkey_settings.BATCH_DEFAULT_TOKENS_PER_SECOND = 200.0
    llama = make_model("llama", capabilities=["chat"])
    use_case = make_use_case(make_tenant("acme"), "assistant", models=(llama,))
    _day_class(use_case)
    key, secret = make_key(use_case)
    alice = key_client(secret)
    document = SimpleUploadedFile("requests.jsonl", jsonl([chat_line("req-0")]))
    uploaded = alice.post("/v1/files", {"file": document, "purpose": "batch"}, format="multipart")
    assert uploaded.status_code == 200, uploaded.content
    body = {
        "input_file_id": uploaded.json()["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    batch = alice.post("/v1/batches", body, format="json")
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
    FileRegistration.objects.filter(pk=registration.pk).update(outputs={"results": object_name})
    registration.refresh_from_db()
    olivia = Actor.for_user(make_user("olivia", Role.OFFICER))
    return World(
        use_case=use_case,
        key=key,
        alice=alice,
        file_id=uploaded.json()["id"],
        output_id=output_id,
        batch_id=batch.json()["id"],
        registration=registration,
        olivia=olivia,
    )


@dataclass(frozen=True)
class Door:
    method: str
    path: str  # {file}, {output}, {batch}, {registration} filled from the world
    ok: int  # what the door answers the key while the use case is approved
    body: Callable[[World], dict[str, Any]] | None = None
    multipart: bool = False

    def call(self, client: APIClient, world: World) -> Any:
        path = self.path.format(
            file=world.file_id,
            output=world.output_id,
            batch=world.batch_id,
            registration=world.registration.pk,
        )
        data = self.body(world) if self.body else None
        send = getattr(client, self.method.lower())
        if self.multipart:
            return send(path, data, format="multipart")
        return send(path, data, format="json") if data is not None else send(path)


def _upload(_: World) -> dict[str, Any]:
    document = SimpleUploadedFile("more.jsonl", jsonl([chat_line("req-9")]))
    return {"file": document, "purpose": "batch"}


def _batch(world: World) -> dict[str, Any]:
    return {
        "input_file_id": world.file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }


def _registration(_: World) -> dict[str, Any]:
    return {
        "kind": "batch",
        "filename": "more.jsonl",
        "model": "llama",
        "declared_bytes": 1000,
        "declared_lines": 1,
        "sla_class": "day",
    }


DOORS = {
    "v1-list-files": Door("GET", "/v1/files", 200),
    "v1-upload-file": Door("POST", "/v1/files", 200, _upload, multipart=True),
    "v1-retrieve-file": Door("GET", "/v1/files/{file}", 200),
    "v1-file-content": Door("GET", "/v1/files/{file}/content", 200),
    "v1-batch-output-content": Door("GET", "/v1/files/{output}/content", 200),
    "v1-delete-file": Door("DELETE", "/v1/files/{output}", 200),
    "v1-list-batches": Door("GET", "/v1/batches", 200),
    "v1-create-batch": Door("POST", "/v1/batches", 200, _batch),
    "v1-retrieve-batch": Door("GET", "/v1/batches/{batch}", 200),
    "v1-cancel-batch": Door("POST", "/v1/batches/{batch}/cancel", 200),
    "api-list-file-jobs": Door("GET", "/api/files/", 200),
    "api-register-file-job": Door("POST", "/api/files/", 201, _registration),
    "api-retrieve-file-job": Door("GET", "/api/files/{registration}/", 200),
    "api-cancel-file-job": Door("POST", "/api/files/{registration}/cancel/", 200),
    "api-file-job-original": Door("GET", "/api/files/{registration}/original/", 200),
    "api-file-job-output": Door("GET", "/api/files/{registration}/outputs/results/", 200),
}


def suspend(world: World) -> None:
    use_case_transition(
        actor=world.olivia, use_case=world.use_case, transition="suspend", reason="Audit finding"
    )


def retire(world: World) -> None:
    use_case_transition(actor=world.olivia, use_case=world.use_case, transition="retire")


def revoke(world: World) -> None:
    api_key_revoke(actor=world.olivia, key=world.key, reason="Leaked")


def expire(world: World) -> None:
    ApiKey.objects.filter(pk=world.key.pk).update(
        expires_at=timezone.now() - dt.timedelta(minutes=1)
    )


STATES = {
    "use-case-suspended": suspend,
    "use-case-retired": retire,
    "key-revoked": revoke,
    "key-expired": expire,
}


@pytest.mark.parametrize("door", DOORS.values(), ids=DOORS.keys())
def test_every_door_answers_the_key_while_its_use_case_is_approved(
    world: World, door: Door
) -> None:
    """The doors below are real: the same key is served while nothing stops it."""
    answer = door.call(world.alice, world)
    assert answer.status_code == door.ok, getattr(answer, "content", b"")


@pytest.mark.parametrize("stop", STATES.values(), ids=STATES.keys())
@pytest.mark.parametrize("door", DOORS.values(), ids=DOORS.keys())
def test_a_key_that_may_no_longer_act_is_refused_at_every_door(
    world: World, door: Door, stop: Callable[[World], None]
) -> None:
    """GIVEN the use case's key, once its use case is suspended or retired, or the key is
    revoked or expired
    WHEN it calls any web door that takes an API key
    THEN 401, as the gateway answers it (OpenAI's shape on /v1, DRF's on /api/), and nothing
    is read or changed."""
    stop(world)
    registration_before = FileRegistration.objects.values().get(pk=world.registration.pk)
    files_before = list(ApiFile.objects.values().order_by("pk"))

    answer = door.call(world.alice, world)

    assert answer.status_code == 401, getattr(answer, "content", b"")
    if door.path.startswith("/v1/"):
        assert answer.json() == {
            "error": {
                "message": "Incorrect API key provided.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        }
    else:
        assert "not valid" in answer.json()["detail"]
        assert answer["WWW-Authenticate"].startswith('Bearer realm="switchyard"')
    assert FileRegistration.objects.values().get(pk=world.registration.pk) == registration_before
    assert list(ApiFile.objects.values().order_by("pk")) == files_before
    assert FileRegistration.objects.count() == 1


# --- a service-account token stands for its bound use case on /v1 --------------------------


@pytest.fixture
def realm(live_valkey_settings: Any, provider: Provider, tmp_path: Path) -> Provider:
    for name, value in settings_from_environment(SWITCHYARD_OIDC_ISSUER=provider.issuer).items():
        if name.startswith(("OIDC_", "SSO_")):
            setattr(live_valkey_settings, name, value)
    _files_storage(live_valkey_settings, tmp_path)
    return provider


@pytest.mark.parametrize("transition", ["suspend", "retire"])
def test_a_service_account_of_a_stopped_use_case_is_refused_on_v1(
    realm: Provider, transition: str
) -> None:
    """GIVEN the automation client bound to acme's ``docs`` use case, which an officer then
    suspends or retires
    WHEN its token lists the use case's files or batches
    THEN 403 in OpenAI's shape, saying why (as for a client bound to no use case)."""
    llama = make_model("llama", capabilities=["chat"])
    docs = make_use_case(
        make_tenant("acme"), "docs", models=(llama,), service_account_client_id=AUTOMATION_CLIENT
    )
    headers = {"Authorization": f"Bearer {realm.client_credentials_token()}"}
    assert Client().get("/v1/files", headers=headers).status_code == 200
    olivia = Actor.for_user(make_user("olivia", Role.OFFICER))
    docs = use_case_transition(actor=olivia, use_case=docs, transition=transition, reason="Audit")

    for path in ("/v1/files", "/v1/batches"):
        answer = Client().get(path, headers=headers)
        assert answer.status_code == 403, answer.content
        error = answer.json()["error"]
        assert error["type"] == "permission_error"
        assert f"which is {docs.status}" in error["message"]
