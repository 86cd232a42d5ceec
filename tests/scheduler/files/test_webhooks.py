"""A file's end told to its use case's webhook: set by the team, signed, retried, never to a
URL that is not http(s). A real local HTTP server receives and verifies each delivery."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from governance.audit import Actor
from governance.choices import FileState
from governance.models import AuditEvent, FileRegistration, UseCase
from governance.roles import Role
from scheduler.files.webhook_settings import webhook_set
from scheduler.files.webhooks import WebhookRetry, webhook_deliver
from testkit.factories import make_model, make_tenant, make_use_case, make_user
from testkit.file_jobs_world import (
    WebhookReceiver,
    allow_receivers,
    verify_standard_webhook,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def use_case(settings: Any) -> UseCase:
    allow_receivers(settings)  # the receivers are on loopback (tests/security/test_outbound_urls)
    llama = make_model("llama", capabilities=["chat"])
    return make_use_case(make_tenant("acme"), "docs", models=(llama,))


def _ended(use_case: UseCase, state: str = FileState.DONE) -> FileRegistration:
    return FileRegistration.objects.create(
        use_case=use_case,
        registered_by="tests",
        kind="text",
        filename="notes.txt",
        model=use_case.allowed_models.get(),
        declared_bytes=10,
        state=state,
        estimated_tokens=10,
        promised_by=datetime.now(UTC) + timedelta(hours=1),
        outputs={"text.txt": "uploads/acme/docs/1/out/text.txt"},
        counts={"pages": 1},
    )


def test_a_delivery_is_signed_the_standard_webhooks_way(use_case: UseCase) -> None:
    with WebhookReceiver() as receiver:
        secret = webhook_set(actor=Actor.system("tests"), use_case=use_case, url=receiver.url)
        assert secret is not None
        assert secret.startswith("whsec_")
        use_case.refresh_from_db()
        assert secret not in use_case.webhook_secret_sealed  # stored sealed, not as given
        registration = _ended(use_case)

        assert webhook_deliver(registration.pk, "file.done", "msg_1_done") == "delivered"

    [(headers, body)] = receiver.received
    assert verify_standard_webhook(secret, headers, body)
    assert headers["webhook-id"] == "msg_1_done"
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 300
    event = orjson.loads(body)
    assert event["type"] == "file.done"
    assert event["data"]["id"] == registration.pk
    assert event["data"]["state"] == "done"
    assert event["data"]["outputs"] == {"text.txt": "uploads/acme/docs/1/out/text.txt"}
    # a body changed on the way no longer verifies
    assert not verify_standard_webhook(secret, headers, body.replace(b"done", b"fail"))


def test_a_receiver_that_fails_is_asked_again_with_the_same_id(use_case: UseCase) -> None:
    with WebhookReceiver(statuses=[503]) as receiver:
        secret = webhook_set(actor=Actor.system("tests"), use_case=use_case, url=receiver.url)
        assert secret is not None
        registration = _ended(use_case, FileState.FAILED)
        with pytest.raises(WebhookRetry, match="503"):
            webhook_deliver(registration.pk, "file.failed", "msg_2_failed")
        assert webhook_deliver(registration.pk, "file.failed", "msg_2_failed") == "delivered"
    assert [h["webhook-id"] for h, _ in receiver.received] == ["msg_2_failed"] * 2
    assert all(verify_standard_webhook(secret, h, b) for h, b in receiver.received)


def test_a_receiver_that_does_not_answer_is_retried(use_case: UseCase) -> None:
    webhook_set(actor=Actor.system("tests"), use_case=use_case, url="http://127.0.0.1:9/hook")
    with pytest.raises(WebhookRetry, match="no answer"):
        webhook_deliver(_ended(use_case).pk, "file.done", "msg_3_done")


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://example.org/x", "gopher://x", "http:///nohost", "x" * 600]
)
def test_only_http_urls_are_taken(use_case: UseCase, url: str) -> None:
    with pytest.raises(ValidationError):
        webhook_set(actor=Actor.system("tests"), use_case=use_case, url=url)
    use_case.refresh_from_db()
    assert use_case.webhook_url == ""


def test_a_new_url_gets_a_new_secret_and_clearing_drops_it(use_case: UseCase) -> None:
    olivia = make_user("olivia", Role.OFFICER)
    first = webhook_set(actor=Actor.for_user(olivia), use_case=use_case, url="https://a.example/h")
    second = webhook_set(actor=Actor.for_user(olivia), use_case=use_case, url="https://b.example/h")
    assert first is not None
    assert second is not None
    assert first != second
    assert webhook_set(actor=Actor.for_user(olivia), use_case=use_case, url="") is None
    use_case.refresh_from_db()
    assert (use_case.webhook_url, use_case.webhook_secret_sealed) == ("", "")
    audited = AuditEvent.objects.filter(action="usecase.webhook_set").order_by("sequence")
    assert [e.after["webhook_url"] for e in audited if e.after] == [
        "https://a.example/h",
        "https://b.example/h",
        "",
    ]
    assert all(first not in str(e.after) for e in audited)


def test_developers_of_the_tenant_may_set_it_others_may_not(use_case: UseCase) -> None:
    alice = make_user("alice", Role.DEVELOPER, tenants=(use_case.tenant,))
    bob = make_user("bob", Role.DEVELOPER, tenants=(make_tenant("globex"),))
    audrey = make_user("audrey", Role.AUDITOR)
    assert webhook_set(actor=Actor.for_user(alice), use_case=use_case, url="https://a.example/h")
    for outsider in (bob, audrey):
        with pytest.raises(PermissionDenied):
            webhook_set(actor=Actor.for_user(outsider), use_case=use_case, url="https://x.example")


def test_the_api_sets_the_webhook_and_shows_the_secret_once(use_case: UseCase) -> None:
    from rest_framework.test import APIClient

    alice = make_user("alice", Role.DEVELOPER, tenants=(use_case.tenant,))
    bob = make_user("bob", Role.DEVELOPER, tenants=(make_tenant("globex"),))
    audrey = make_user("audrey", Role.AUDITOR, tenants=(use_case.tenant,))
    path = f"/api/use-cases/{use_case.pk}/webhook/"
    client = APIClient()

    client.force_authenticate(alice)
    answer = client.post(path, {"url": "https://hooks.acme.example/files"}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["webhook_url"] == "https://hooks.acme.example/files"
    assert answer.json()["secret"].startswith("whsec_")
    refused = client.post(path, {"url": "file:///etc/passwd"}, format="json")
    assert refused.status_code == 400
    assert "http:// or https://" in str(refused.json()["webhook_url"])
    shown = client.get(f"/api/use-cases/{use_case.pk}/")
    assert answer.json()["secret"] not in shown.content.decode()

    client.force_authenticate(bob)
    assert client.post(path, {"url": "https://x.example"}, format="json").status_code == 404
    client.force_authenticate(audrey)
    assert client.post(path, {"url": "https://x.example"}, format="json").status_code == 403
    use_case.refresh_from_db()
    assert use_case.webhook_url == "https://hooks.acme.example/files"
