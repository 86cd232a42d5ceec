"""The review queue: each request with its context and history, and four eyes on every kind.

Personas: alice is a developer of acme, olivia and oscar governance officers, audrey an
auditor. The queue holds key requests and submitted use cases (file registrations need no
approval: docs/files.md).
"""

from __future__ import annotations

from html import unescape

import pytest
from django.test import Client

from governance.audit import Actor
from governance.choices import ApiKeyStatus, UseCaseStatus
from governance.models import ApiKey, AuditEvent, UseCase
from governance.roles import Role
from governance.services.api_keys import api_key_request
from governance.services.use_cases import use_case_transition
from testkit.factories import make_model, make_tenant, make_use_case, make_user
from tests.portal.test_officer_support import text, url

pytestmark = pytest.mark.django_db


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def people():
    acme = make_tenant("acme")
    return {
        "acme": acme,
        "alice": make_user("alice", Role.DEVELOPER, tenants=(acme,)),
        "olivia": make_user("olivia", Role.OFFICER),
        "oscar": make_user("oscar", Role.OFFICER),
        "audrey": make_user("audrey", Role.AUDITOR),
    }


@pytest.fixture
def chatbot(people) -> UseCase:
    return make_use_case(
        people["acme"],
        "chatbot",
        models=(make_model("llama-3.1-8b"),),
        purpose="Answer questions about card payments.",
        data_classification="confidential",
        requests_per_minute=60,
        tokens_per_day=50000,
    )


def _key_requested_by(user, use_case: UseCase) -> ApiKey:
    return api_key_request(
        actor=Actor(username=user.get_username(), user=user),
        use_case=use_case,
        name="checkout",
        reason="The checkout service answers questions.",
    )


def _submitted_by(user, use_case: UseCase) -> UseCase:
    return use_case_transition(
        actor=Actor(username=user.get_username(), user=user),
        use_case=use_case,
        transition="submit",
    )


def _row_of(html: str, marker: str) -> str:
    """The queue's table row that holds ``marker`` (so a check cannot match another row)."""
    for row in html.split("<tr>")[1:]:
        if marker in row:
            return row.split("</tr>")[0]
    raise AssertionError(f"no row holds {marker!r}")


def test_a_key_request_shows_who_asked_why_the_use_case_and_its_history(people, chatbot) -> None:
    key = _key_requested_by(people["alice"], chatbot)

    html = unescape(_signed_in(people["olivia"]).get(url("review")).content.decode())

    row = text(_row_of(html, f'href="{url("key_detail", key.pk)}"'))
    assert "alice" in row
    assert "The checkout service answers questions." in row
    assert "Answer questions about card payments." in row
    assert "Confidential" in row
    assert "llama-3.1-8b" in row
    assert "60 req/min" in row
    assert "50000 tokens/day" in row
    assert "History of this request (1 event)" in row
    assert "apikey.request by alice" in row


def test_a_submitted_use_case_shows_who_submitted_it_and_its_history(people, chatbot) -> None:
    draft = make_use_case(
        people["acme"],
        "summariser",
        status=UseCaseStatus.DRAFT,
        purpose="Summarise complaint letters.",
        data_classification="restricted",
        models=(chatbot.allowed_models.get(),),
        max_concurrent=4,
    )
    _submitted_by(people["alice"], draft)

    html = unescape(_signed_in(people["olivia"]).get(url("review")).content.decode())

    row = text(_row_of(html, f'href="{url("use_case_detail", draft.pk)}"'))
    assert "alice" in row
    assert "Summarise complaint letters." in row
    assert "Restricted" in row
    assert "llama-3.1-8b" in row
    assert "4 concurrent" in row
    assert "History (1 event)" in row
    assert "usecase.submit by alice" in row


# --- four eyes: whoever asked never approves, whatever the kind ----------------------------
def test_an_officer_cannot_approve_a_key_they_requested(people, chatbot) -> None:
    key = _key_requested_by(people["olivia"], chatbot)
    olivia = _signed_in(people["olivia"])

    row = _row_of(olivia.get(url("review")).content.decode(), url("key_detail", key.pk))
    assert "another officer decides it" in text(row)
    assert 'value="approve"' not in row
    response = olivia.post(url("key_decide", key.pk), {"decision": "approve"})

    assert response.status_code == 403
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.PENDING
    assert not AuditEvent.objects.filter(action="apikey.approve").exists()
    # … and another officer can.
    _signed_in(people["oscar"]).post(url("key_decide", key.pk), {"decision": "approve"})
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.APPROVED
    assert AuditEvent.objects.get(action="apikey.approve").actor == "oscar"


def test_an_officer_cannot_approve_a_use_case_they_submitted(people) -> None:
    draft = make_use_case(people["acme"], "summariser", status=UseCaseStatus.DRAFT)
    _submitted_by(people["olivia"], draft)
    olivia = _signed_in(people["olivia"])

    row = _row_of(olivia.get(url("review")).content.decode(), url("use_case_detail", draft.pk))
    assert "another officer decides it" in text(row)
    assert 'value="approve"' not in row
    response = olivia.post(url("use_case_transition", draft.pk), {"transition": "approve"})

    assert response.status_code == 403
    draft.refresh_from_db()
    assert draft.status == UseCaseStatus.SUBMITTED
    assert not AuditEvent.objects.filter(action="usecase.approve").exists()
    _signed_in(people["oscar"]).post(
        url("use_case_transition", draft.pk), {"transition": "approve"}
    )
    draft.refresh_from_db()
    assert draft.status == UseCaseStatus.APPROVED


def test_a_use_case_an_officer_creates_submitted_in_the_form_needs_another_officer(
    people,
) -> None:
    from tests.portal.test_officer_support import apply, guardrail_rows, review

    make_model("llama")
    data = {
        "tenant": "acme",
        "slug": "fraud-triage",
        "name": "Fraud triage",
        "kind": "extraction",
        "purpose": "Pull the facts out of fraud reports.",
        "data_classification": "restricted",
        "namespace": "prod",
        "models": ["llama"],
        "guardrail_failure": "closed",
        "record_policy": "metadata",
        "record_retention_days": "90",
        "submit_now": "on",
        **guardrail_rows(),
    }
    olivia = _signed_in(people["olivia"])
    apply(olivia, url("use_case_new"), data, review(olivia, url("use_case_new"), data))
    created = UseCase.objects.get(slug="fraud-triage")
    assert created.status == UseCaseStatus.SUBMITTED

    response = olivia.post(url("use_case_transition", created.pk), {"transition": "approve"})

    assert response.status_code == 403
    created.refresh_from_db()
    assert created.status == UseCaseStatus.SUBMITTED


def test_auditors_read_the_queue_and_decide_nothing(people, chatbot) -> None:
    key = _key_requested_by(people["alice"], chatbot)
    audrey = _signed_in(people["audrey"])

    html = audrey.get(url("review")).content.decode()
    assert "History of this request" in html
    assert 'value="approve"' not in html
    response = audrey.post(url("key_decide", key.pk), {"decision": "approve"})

    assert response.status_code == 403
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.PENDING


def test_developers_do_not_see_the_queue(people) -> None:
    assert _signed_in(people["alice"]).get(url("review")).status_code == 404
