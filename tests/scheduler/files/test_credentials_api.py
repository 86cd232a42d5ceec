"""S3 credentials on /api/: issued to the use case's developers and officers, the secret shown
once, rotated, revoked, audited; another tenant's developer sees none of it.

alice develops for acme, bob for globex, olivia is an officer, aubrey an auditor.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from governance.choices import ApiKeyStatus, FileState, UseCaseStatus
from governance.models import AuditEvent, FileRegistration, S3Credential
from governance.roles import Role
from scheduler.files.s3_credentials import secret_of
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(settings: Any) -> dict[str, Any]:
    settings.S3_ENDPOINT_PUBLIC_URL = "https://uploads.example.test"
    acme, globex = make_tenant("acme"), make_tenant("globex")
    whisper = make_model("whisper", capabilities=["transcription"])
    return {
        "transcribe": make_use_case(acme, "transcribe", models=(whisper,)),
        "draft": make_use_case(acme, "drafty", status=UseCaseStatus.DRAFT),
        "alice": make_user("alice", Role.DEVELOPER, tenants=(acme,)),
        "bob": make_user("bob", Role.DEVELOPER, tenants=(globex,)),
        "olivia": make_user("olivia", Role.OFFICER),
        "aubrey": make_user("aubrey", Role.AUDITOR),
        "whisper": whisper,
    }


def as_user(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def issue(client: APIClient, use_case_id: int, **body: Any) -> Any:
    return client.post(f"/api/use-cases/{use_case_id}/s3-credentials/", body, format="json")


def test_a_developer_issues_a_credential_and_sees_the_secret_once(world: dict[str, Any]) -> None:
    alice = as_user(world["alice"])
    answer = issue(alice, world["transcribe"].pk, name="nightly uploads")
    assert answer.status_code == 201, answer.content
    assert answer["Cache-Control"] == "no-store"
    body = answer.json()
    key_id, secret = body["credential"]["access_key_id"], body["secret_access_key"]
    assert re.fullmatch(r"SYAK[A-Z2-7]{16}", key_id)
    assert len(secret) == 40
    stored = S3Credential.objects.get(access_key_id=key_id)
    assert secret not in stored.secret_sealed  # sealed, not in the clear
    assert secret_of(stored) == secret
    listed = alice.get(f"/api/use-cases/{world['transcribe'].pk}/s3-credentials/")
    shown = alice.get(f"/api/s3-credentials/{stored.pk}/")
    for later in (listed, shown):
        assert later.status_code == 200
        assert key_id in later.content.decode()
        assert secret not in later.content.decode()
    event = AuditEvent.objects.get(action="s3credential.issue")
    assert event.actor == "alice"
    after: dict[str, Any] = event.after or {}
    assert after["access_key_id"] == key_id
    assert secret not in str(event.after)


def test_another_tenants_developer_cannot_see_issue_rotate_or_revoke(
    world: dict[str, Any],
) -> None:
    credential_id = issue(as_user(world["alice"]), world["transcribe"].pk).json()["credential"][
        "id"
    ]
    bob = as_user(world["bob"])
    assert issue(bob, world["transcribe"].pk).status_code == 404
    assert bob.get(f"/api/use-cases/{world['transcribe'].pk}/s3-credentials/").status_code == 404
    assert bob.get("/api/s3-credentials/").json()["count"] == 0
    for verb in ("rotate", "revoke"):
        assert bob.post(f"/api/s3-credentials/{credential_id}/{verb}/").status_code == 404
    assert S3Credential.objects.get(pk=credential_id).status == ApiKeyStatus.ACTIVE


def test_an_auditor_reads_but_does_not_issue_and_an_officer_may(world: dict[str, Any]) -> None:
    issue(as_user(world["alice"]), world["transcribe"].pk)
    aubrey = as_user(world["aubrey"])
    assert aubrey.get("/api/s3-credentials/").json()["count"] == 1
    assert issue(aubrey, world["transcribe"].pk).status_code == 403
    assert issue(as_user(world["olivia"]), world["transcribe"].pk).status_code == 201


def test_credentials_are_issued_for_approved_use_cases_only(world: dict[str, Any]) -> None:
    answer = issue(as_user(world["alice"]), world["draft"].pk)
    assert answer.status_code == 409
    assert "approved" in answer.json()["detail"]
    assert not S3Credential.objects.exists()


def test_an_expiry_in_the_past_is_refused(world: dict[str, Any]) -> None:
    past = (timezone.now() - timedelta(hours=1)).isoformat()
    answer = issue(as_user(world["alice"]), world["transcribe"].pk, expires_at=past)
    assert answer.status_code == 400
    assert "expires_at" in answer.json()


def test_rotation_hands_out_a_new_pair_and_revokes_the_old_one(world: dict[str, Any]) -> None:
    alice = as_user(world["alice"])
    old = issue(alice, world["transcribe"].pk).json()
    answer = alice.post(f"/api/s3-credentials/{old['credential']['id']}/rotate/")
    assert answer.status_code == 200
    assert answer["Cache-Control"] == "no-store"
    new = answer.json()
    assert new["credential"]["access_key_id"] != old["credential"]["access_key_id"]
    assert new["secret_access_key"] != old["secret_access_key"]
    assert new["credential"]["rotated_from"] == old["credential"]["access_key_id"]
    assert S3Credential.objects.get(pk=old["credential"]["id"]).status == ApiKeyStatus.REVOKED
    again = alice.post(f"/api/s3-credentials/{old['credential']['id']}/rotate/")
    assert again.status_code == 409
    assert AuditEvent.objects.filter(action="s3credential.rotate").count() == 1


def test_rotation_with_grace_keeps_the_old_pair_until_the_grace_ends(
    world: dict[str, Any],
) -> None:
    alice = as_user(world["alice"])
    old = issue(alice, world["transcribe"].pk).json()["credential"]
    before = timezone.now()
    answer = alice.post(
        f"/api/s3-credentials/{old['id']}/rotate/", {"grace_seconds": 3600}, format="json"
    )
    assert answer.status_code == 200
    kept = S3Credential.objects.get(pk=old["id"])
    assert kept.status == ApiKeyStatus.ACTIVE
    assert kept.expires_at is not None
    assert before + timedelta(seconds=3590) < kept.expires_at < before + timedelta(seconds=3700)
    too_long = alice.post(
        f"/api/s3-credentials/{answer.json()['credential']['id']}/rotate/",
        {"grace_seconds": 8 * 86400},
        format="json",
    )
    assert too_long.status_code == 400


def test_revocation_is_audited_and_happens_once(world: dict[str, Any]) -> None:
    alice = as_user(world["alice"])
    credential = issue(alice, world["transcribe"].pk).json()["credential"]
    answer = alice.post(
        f"/api/s3-credentials/{credential['id']}/revoke/", {"reason": "laptop lost"}, format="json"
    )
    assert answer.status_code == 200
    assert answer.json()["status"] == "revoked"
    assert answer.json()["revoked_at"] is not None
    assert alice.post(f"/api/s3-credentials/{credential['id']}/revoke/").status_code == 409
    event = AuditEvent.objects.get(action="s3credential.revoke")
    assert (event.after or {})["reason"] == "laptop lost"


def test_a_waiting_registration_says_where_to_upload_it(world: dict[str, Any]) -> None:
    waiting = FileRegistration.objects.create(
        use_case=world["transcribe"],
        registered_by="alice",
        kind="audio",
        filename="call 1.wav",
        model=world["whisper"],
        declared_bytes=1000,
        estimated_tokens=10,
        promised_by=timezone.now() + timedelta(hours=1),
    )
    answer = as_user(world["alice"]).get(f"/api/files/{waiting.pk}/")
    assert answer.status_code == 200
    upload = answer.json()["upload"]
    assert upload["endpoint_url"] == "https://uploads.example.test"
    assert upload["bucket"] == "acme-transcribe"
    assert upload["key"] == f"{waiting.pk}/call 1.wav"
    url = upload["presigned_put_url"]
    assert url.startswith(
        f"https://uploads.example.test/acme-transcribe/{waiting.pk}/call%201.wav?"
    )
    assert "X-Amz-Expires=3600" in url
    assert "X-Amz-Credential=SYPU" in url
    FileRegistration.objects.filter(pk=waiting.pk).update(state=FileState.CANCELLED)
    assert as_user(world["alice"]).get(f"/api/files/{waiting.pk}/").json()["upload"] is None
