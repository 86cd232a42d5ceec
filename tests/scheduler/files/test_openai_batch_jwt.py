"""/v1/files and /v1/batches with a Keycloak service-account token from a real OIDC provider
process: the token stands for the use case its client is bound to, as on the gateway's /v1.

GIVEN the automation client (a developer of acme) bound to acme's ``docs`` use case
WHEN it uploads a batch input and creates a batch with its token
THEN both belong to ``docs``, the batch is registered under the service account's name, and
a token of a client bound to no use case is refused (403) in OpenAI's shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from governance.models import ApiFile, FileRegistration, Model, PriorityClass, SlaClass
from testkit.factories import make_tenant, make_use_case
from testkit.oidc import (
    AUTOMATION_CLIENT,
    Provider,
    settings_from_environment,
)
from testkit.openai_batch import chat_line, jsonl

pytestmark = pytest.mark.django_db


@pytest.fixture
def realm(live_valkey_settings: Any, provider: Provider, tmp_path: Path) -> Provider:
    for name, value in settings_from_environment(SWITCHYARD_OIDC_ISSUER=provider.issuer).items():
        if name.startswith(("OIDC_", "SSO_")):
            setattr(live_valkey_settings, name, value)
    live_valkey_settings.STORAGES = {
        **live_valkey_settings.STORAGES,
        "files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "files"), "allow_overwrite": True},
        },
    }
    return provider


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_bound_service_account_uploads_and_creates_batches_for_its_use_case(
    realm: Provider,
) -> None:
    llama = Model.objects.create(public_id="llama", capabilities=["chat"])
    docs = make_use_case(
        make_tenant("acme"), "docs", models=(llama,), service_account_client_id=AUTOMATION_CLIENT
    )
    SlaClass.objects.create(
        use_case=docs,
        name="day",
        turnaround_seconds=86400,
        priority_class=PriorityClass.objects.get(name="batch"),
        kinds=["batch"],
    )
    token = realm.client_credentials_token()
    upload = SimpleUploadedFile("in.jsonl", jsonl([chat_line("a")]))

    uploaded = Client().post(
        "/v1/files", {"file": upload, "purpose": "batch"}, headers=bearer(token)
    )
    assert uploaded.status_code == 200, uploaded.content
    assert ApiFile.objects.get().use_case == docs
    created = Client().post(
        "/v1/batches",
        {
            "input_file_id": uploaded.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
        content_type="application/json",
        headers=bearer(token),
    )
    assert created.status_code == 200, created.content
    registration = FileRegistration.objects.get()
    assert registration.use_case == docs
    assert registration.api_key is None
    assert registration.registered_by == f"service-account-{AUTOMATION_CLIENT}"
    listed = Client().get("/v1/batches", headers=bearer(token)).json()
    assert [b["id"] for b in listed["data"]] == [created.json()["id"]]


def test_a_service_account_bound_to_no_use_case_is_refused(realm: Provider) -> None:
    make_tenant("acme")
    answer = Client().get("/v1/files", headers=bearer(realm.client_credentials_token()))
    assert answer.status_code == 403
    error = answer.json()["error"]
    assert error["type"] == "permission_error"
    assert "bound to no use case" in error["message"]
