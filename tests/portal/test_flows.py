"""The portal's flows for developers, officers and auditors, and every refusal.

Personas: alice and carol are developers of tenant acme, bob a developer of tenant globex,
olivia a governance officer, audrey an auditor, mallory has an account and no role.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from html import unescape

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from governance.choices import ApiKeyStatus, UseCaseStatus
from governance.models import ApiKey, AuditEvent, UseCase
from governance.roles import Role
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db


@dataclass
class World:
    acme_chatbot: UseCase
    acme_draft: UseCase
    globex_search: UseCase
    alice: Client
    carol: Client
    bob: Client
    olivia: Client
    audrey: Client
    mallory: Client


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def world(settings) -> World:
    settings.GATEWAY_PUBLIC_URL = "https://gateway.example.test"
    acme, globex = make_tenant("acme"), make_tenant("globex")
    llama = make_model("llama-3.1-8b")
    acme_chatbot = make_use_case(
        acme, "chatbot", models=(llama,), requests_per_minute=60, tokens_per_minute=20000
    )
    acme_draft = make_use_case(acme, "summariser", status=UseCaseStatus.SUBMITTED)
    globex_search = make_use_case(globex, "search", models=(llama,))
    return World(
        acme_chatbot=acme_chatbot,
        acme_draft=acme_draft,
        globex_search=globex_search,
        alice=_client_for(make_user("alice", Role.DEVELOPER, tenants=(acme,))),
        carol=_client_for(make_user("carol", Role.DEVELOPER, tenants=(acme,))),
        bob=_client_for(make_user("bob", Role.DEVELOPER, tenants=(globex,))),
        olivia=_client_for(make_user("olivia", Role.OFFICER)),
        audrey=_client_for(make_user("audrey", Role.AUDITOR)),
        mallory=_client_for(make_user("mallory")),
    )


# --- helpers ------------------------------------------------------------------------------
def _flash(response) -> str:
    """The message this response added (earlier ones wait, unread, in the same store)."""
    return [str(m) for m in get_messages(response.wsgi_request)][-1]


def _request_key(client: Client, use_case: UseCase, name: str = "checkout") -> ApiKey:
    response = client.post(
        reverse("portal:key_request", args=[use_case.pk]),
        {"name": name, "reason": "The checkout service answers questions."},
    )
    assert response.status_code == 302, response.content.decode()
    return ApiKey.objects.get(name=name, use_case=use_case)


def _approve(client: Client, key: ApiKey) -> None:
    response = client.post(reverse("portal:key_decide", args=[key.pk]), {"decision": "approve"})
    assert response.status_code == 302


def _reveal(client: Client, key: ApiKey) -> str:
    """The plaintext, read off the one page that shows it."""
    response = client.post(reverse("portal:key_reveal", args=[key.pk]))
    assert response.status_code == 200
    key.refresh_from_db()
    html = response.content.decode()
    start = html.index('id="secret-key">') + len('id="secret-key">')
    plaintext = html[start : html.index("</code>", start)]
    assert plaintext.startswith(key.prefix)
    assert len(plaintext) > 30
    return plaintext


def _active_key(world: World) -> tuple[ApiKey, str]:
    key = _request_key(world.alice, world.acme_chatbot)
    _approve(world.olivia, key)
    return key, _reveal(world.alice, key)


def _has_post_forms_besides_sign_out(html: str) -> bool:
    return html.count('method="post"') > 1


# --- developer ------------------------------------------------------------------------------
def test_alice_sees_her_tenants_use_cases_with_status_models_and_limits(world: World) -> None:
    page = world.alice.get(reverse("portal:dashboard"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Chatbot" in html
    assert "llama-3.1-8b" in html
    assert "60 req/min" in html
    assert "Approved" in html
    assert "Submitted" in html
    assert "Search" not in html  # globex's
    assert "My use cases &amp; keys" in html
    assert "Review queue" not in html


def test_alice_requests_a_key_and_sees_it_pending(world: World) -> None:
    detail = world.alice.get(reverse("portal:use_case_detail", args=[world.acme_chatbot.pk]))
    assert "Request an API key" in detail.content.decode()
    form = world.alice.get(reverse("portal:key_request", args=[world.acme_chatbot.pk]))
    assert form.status_code == 200
    assert 'for="id_reason"' in form.content.decode()  # labelled fields

    response = world.alice.post(
        reverse("portal:key_request", args=[world.acme_chatbot.pk]),
        {"name": "checkout", "reason": "Checkout answers.", "expires_on": _days_ahead(30)},
        follow=True,
    )
    key = ApiKey.objects.get(name="checkout")
    assert key.status == ApiKeyStatus.PENDING
    assert key.requested_by is not None
    assert key.requested_by.get_username() == "alice"
    assert key.expires_at is not None
    assert key.expires_at > timezone.now() + timedelta(days=29)
    html = response.content.decode()
    assert "requested" in html
    assert "Waiting for a governance officer" in html
    assert "Pending approval" in world.alice.get(reverse("portal:dashboard")).content.decode()
    assert AuditEvent.objects.filter(action="apikey.request", object_id=str(key.pk)).exists()


def _days_ahead(days: int) -> str:
    return (timezone.localdate() + timedelta(days=days)).isoformat()


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"name": "k", "reason": ""}, "This field is required."),
        ({"name": "k", "reason": "r", "expires_on": _days_ahead(-1)}, "Choose a day after today."),
        (
            {"name": "k", "reason": "r", "expires_on": _days_ahead(400)},
            "Keys live at most 365 days.",
        ),
    ],
    ids=["no-reason", "expiry-in-the-past", "expiry-too-far"],
)
def test_a_key_request_with_bad_input_is_shown_back_with_the_error(
    world: World, data: dict[str, str], error: str
) -> None:
    page = world.alice.post(reverse("portal:key_request", args=[world.acme_chatbot.pk]), data)
    assert page.status_code == 200
    assert error in page.content.decode()
    assert not ApiKey.objects.exists()


def test_keys_are_requested_only_for_approved_use_cases(world: World) -> None:
    page = world.alice.get(reverse("portal:key_request", args=[world.acme_draft.pk]))
    assert "Keys are issued for approved use cases" in page.content.decode()
    response = world.alice.post(
        reverse("portal:key_request", args=[world.acme_draft.pk]), {"name": "k", "reason": "r"}
    )
    assert response.status_code == 302
    assert _flash(response) == "Keys are issued for approved use cases; this one is submitted."
    assert not ApiKey.objects.exists()


def test_the_story_request_approve_reveal_once(world: World, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    key = _request_key(world.alice, world.acme_chatbot)
    queue = world.olivia.get(reverse("portal:review")).content.decode()
    assert "checkout" in queue
    assert "The checkout service answers questions." in queue

    response = world.olivia.post(
        reverse("portal:key_decide", args=[key.pk]),
        {"decision": "approve", "next": reverse("portal:review")},
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("portal:review")
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.APPROVED
    assert key.prefix == ""

    detail = world.alice.get(reverse("portal:key_detail", args=[key.pk])).content.decode()
    assert "Reveal key" in detail

    reveal = world.alice.post(reverse("portal:key_reveal", args=[key.pk]))
    assert reveal.status_code == 200
    assert "no-store" in reveal["Cache-Control"]
    html = reveal.content.decode()
    assert "it will not be shown again" in html
    plaintext = _reveal_text(html)
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.ACTIVE
    assert plaintext.startswith(key.prefix)

    again = world.alice.post(reverse("portal:key_reveal", args=[key.pk]))
    assert again.status_code == 302
    assert plaintext not in again.content.decode()
    assert (
        _flash(again)
        == "This key was already revealed; it cannot be shown again. Rotate it instead."
    )

    _assert_plaintext_nowhere_else(world, key, plaintext)
    assert plaintext not in caplog.text  # nor in any log line


def _reveal_text(html: str) -> str:
    start = html.index('id="secret-key">') + len('id="secret-key">')
    return html[start : html.index("</code>", start)]


def _assert_plaintext_nowhere_else(world: World, key: ApiKey, plaintext: str) -> None:
    pages = [
        reverse("portal:home"),
        reverse("portal:dashboard"),
        reverse("portal:review"),
        reverse("portal:use_case_detail", args=[key.use_case.pk]),
        reverse("portal:key_detail", args=[key.pk]),
        reverse("portal:key_rotate", args=[key.pk]),
        reverse("portal:key_revoke", args=[key.pk]),
    ]
    for client in (world.alice, world.carol, world.olivia, world.audrey):
        for url in pages:
            body = client.get(url).content.decode()
            assert plaintext not in body, url
            assert plaintext[len(key.prefix) :] not in body, url
        assert all(plaintext not in c.value for c in client.cookies.values())
    for event in AuditEvent.objects.all():
        assert plaintext not in repr(event.__dict__)
        assert plaintext[len(key.prefix) :] not in repr(event.__dict__)


def test_the_quickstart_uses_the_key_prefix_and_the_gateway_url(world: World) -> None:
    key, plaintext = _active_key(world)
    page = world.alice.get(reverse("portal:key_detail", args=[key.pk]))
    html = unescape(page.content.decode())
    assert f"{key.prefix}…" in html
    assert "https://gateway.example.test/v1/chat/completions" in html  # curl
    assert 'base_url="https://gateway.example.test/v1"' in html  # OpenAI SDK
    assert "llama-3.1-8b" in html
    assert plaintext not in html


def test_only_the_requester_can_reveal_a_key(world: World) -> None:
    key = _request_key(world.alice, world.acme_chatbot)
    _approve(world.olivia, key)
    detail = world.carol.get(reverse("portal:key_detail", args=[key.pk])).content.decode()
    assert "Reveal key" not in detail
    assert "only alice" in detail
    response = world.carol.post(reverse("portal:key_reveal", args=[key.pk]))
    assert response.status_code == 403
    assert "Only the person who requested this key can reveal it." in response.content.decode()
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.APPROVED
    assert key.revealed_at is None


def test_a_pending_key_cannot_be_revealed(world: World) -> None:
    key = _request_key(world.alice, world.acme_chatbot)
    response = world.alice.post(reverse("portal:key_reveal", args=[key.pk]))
    assert response.status_code == 302
    assert _flash(response) == "Only an approved key can be revealed; this one is pending."


def test_rotate_shows_the_new_key_once_and_explains_the_grace_period(
    world: World, settings
) -> None:
    settings.API_KEY_ROTATION_GRACE_SECONDS = 3600
    key, old_plaintext = _active_key(world)
    confirm = world.alice.get(reverse("portal:key_rotate", args=[key.pk])).content.decode()
    assert "grace period of <strong>1\xa0hour</strong>" in confirm

    response = world.alice.post(reverse("portal:key_rotate", args=[key.pk]))
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    html = response.content.decode()
    new_plaintext = _reveal_text(html)
    successor = ApiKey.objects.get(rotated_from=key)
    assert new_plaintext.startswith(successor.prefix)
    assert new_plaintext != old_plaintext
    assert f"The old key <code>{key.prefix}…</code> keeps working until" in html
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.ACTIVE  # still works, for the grace period
    assert key.expires_at is not None
    assert timedelta(minutes=59) < key.expires_at - timezone.now() <= timedelta(hours=1)

    old_detail = world.alice.get(reverse("portal:key_detail", args=[key.pk])).content.decode()
    assert "Rotated: replaced by" in old_detail
    assert "Rotate key" not in old_detail
    again = world.alice.post(reverse("portal:key_rotate", args=[key.pk]))
    assert again.status_code == 302
    assert _flash(again) == "This key was already rotated; rotate its successor instead."
    _assert_plaintext_nowhere_else(world, successor, new_plaintext)


def test_revoke_asks_for_confirmation_then_revokes(world: World) -> None:
    key, _ = _active_key(world)
    confirm = world.alice.get(reverse("portal:key_revoke", args=[key.pk]))
    assert "Yes, revoke this key" in confirm.content.decode()
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.ACTIVE  # asking is not doing

    response = world.alice.post(
        reverse("portal:key_revoke", args=[key.pk]), {"reason": "leaked in a log"}
    )
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.REVOKED
    event = AuditEvent.objects.get(action="apikey.revoke", object_id=str(key.pk))
    assert event.actor == "alice"
    assert event.after is not None
    assert event.after["reason"] == "leaked in a log"

    again = world.alice.post(reverse("portal:key_revoke", args=[key.pk]), {"reason": ""})
    assert _flash(again) == "This key is already revoked."


# --- officer ------------------------------------------------------------------------------
def test_rejecting_a_key_request_needs_a_reason(world: World) -> None:
    key = _request_key(world.alice, world.acme_chatbot)
    url = reverse("portal:key_decide", args=[key.pk])
    refused = world.olivia.post(url, {"decision": "reject", "reason": "  "})
    assert refused.status_code == 302
    assert _flash(refused) == "Say why the request is rejected."
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.PENDING

    world.olivia.post(url, {"decision": "reject", "reason": "Use the shared search key."})
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.REJECTED
    detail = world.alice.get(reverse("portal:key_detail", args=[key.pk])).content.decode()
    assert "rejected: “Use the shared search key.”" in detail


def test_a_key_request_is_decided_once(world: World) -> None:
    key = _request_key(world.alice, world.acme_chatbot)
    _approve(world.olivia, key)
    again = world.olivia.post(reverse("portal:key_decide", args=[key.pk]), {"decision": "reject"})
    assert _flash(again) == "Say why the request is rejected."
    again = world.olivia.post(
        reverse("portal:key_decide", args=[key.pk]), {"decision": "reject", "reason": "no"}
    )
    assert _flash(again) == "This key request was already decided (approved)."


def test_olivia_approves_or_rejects_submitted_use_cases(world: World) -> None:
    queue = world.olivia.get(reverse("portal:review")).content.decode()
    assert "acme/summariser" in queue
    url = reverse("portal:use_case_transition", args=[world.acme_draft.pk])

    refused = world.olivia.post(url, {"transition": "reject", "reason": ""})
    assert _flash(refused) == "Say why you reject this use case."
    world.acme_draft.refresh_from_db()
    assert world.acme_draft.status == UseCaseStatus.SUBMITTED

    world.olivia.post(url, {"transition": "reject", "reason": "Name the data it reads."})
    world.acme_draft.refresh_from_db()
    assert world.acme_draft.status == UseCaseStatus.DRAFT
    assert world.acme_draft.status_reason == "Name the data it reads."


def test_olivia_suspends_with_a_reason_and_reinstates(world: World) -> None:
    detail_url = reverse("portal:use_case_detail", args=[world.acme_chatbot.pk])
    assert "Suspend use case" in world.olivia.get(detail_url).content.decode()
    url = reverse("portal:use_case_transition", args=[world.acme_chatbot.pk])

    refused = world.olivia.post(url, {"transition": "suspend"})
    assert _flash(refused) == "Say why you suspend this use case."

    response = world.olivia.post(url, {"transition": "suspend", "reason": "Data leak under review"})
    assert response["Location"] == detail_url
    assert (
        _flash(response)
        == "Use case acme/chatbot suspended: its keys stop working at the gateway within seconds."
    )
    world.acme_chatbot.refresh_from_db()
    assert world.acme_chatbot.status == UseCaseStatus.SUSPENDED
    page = world.olivia.get(detail_url).content.decode()
    assert "Reinstate use case" in page
    assert "Data leak under review" in page
    assert "acme/chatbot" in world.olivia.get(reverse("portal:review")).content.decode()

    world.olivia.post(url, {"transition": "reinstate"})
    world.acme_chatbot.refresh_from_db()
    assert world.acme_chatbot.status == UseCaseStatus.APPROVED

    twice = world.olivia.post(url, {"transition": "reinstate"})
    assert _flash(twice) == "Cannot reinstate a use case that is approved."


def test_the_officer_nav_shows_the_queue_with_its_size(world: World) -> None:
    _request_key(world.alice, world.acme_chatbot)
    html = world.olivia.get(reverse("portal:home")).content.decode()
    assert "Review queue" in html
    # one key request and one submitted use case wait
    assert '<span class="badge">2<span class="sr-only"> waiting</span></span>' in html


def test_a_developer_cannot_decide_or_suspend(world: World) -> None:
    key = _request_key(world.alice, world.acme_chatbot)
    refused = world.alice.post(reverse("portal:key_decide", args=[key.pk]), {"decision": "approve"})
    assert refused.status_code == 403
    assert "Only a governance officer or an admin may do this." in refused.content.decode()
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.PENDING
    suspend = world.alice.post(
        reverse("portal:use_case_transition", args=[world.acme_chatbot.pk]),
        {"transition": "suspend", "reason": "x"},
    )
    assert suspend.status_code == 403
    assert world.alice.get(reverse("portal:review")).status_code == 404


# --- scoping: bob of globex never sees acme's records ----------------------------------
@pytest.mark.parametrize(
    ("method", "name", "target"),
    [
        ("get", "portal:use_case_detail", "use_case"),
        ("get", "portal:key_detail", "key"),
        ("get", "portal:key_request", "use_case"),
        ("post", "portal:key_request", "use_case"),
        ("get", "portal:key_rotate", "key"),
        ("post", "portal:key_rotate", "key"),
        ("get", "portal:key_revoke", "key"),
        ("post", "portal:key_revoke", "key"),
        ("post", "portal:key_reveal", "key"),
        ("post", "portal:key_decide", "key"),
        ("post", "portal:use_case_transition", "use_case"),
    ],
)
def test_bob_gets_404_for_acmes_records(world: World, method: str, name: str, target: str) -> None:
    key, _ = _active_key(world)
    pk = key.pk if target == "key" else world.acme_chatbot.pk
    data = {"name": "x", "reason": "y", "decision": "approve", "transition": "suspend"}
    response = getattr(world.bob, method)(reverse(name, args=[pk]), data)
    assert response.status_code == 404
    key.refresh_from_db()
    assert key.status == ApiKeyStatus.ACTIVE
    assert ApiKey.objects.count() == 1
    world.acme_chatbot.refresh_from_db()
    assert world.acme_chatbot.status == UseCaseStatus.APPROVED


def test_bobs_dashboard_holds_only_globex(world: World) -> None:
    _active_key(world)
    html = world.bob.get(reverse("portal:dashboard")).content.decode()
    assert "Search" in html
    assert "Chatbot" not in html
    assert "checkout" not in html


def test_mallory_without_a_role_sees_nothing(world: World) -> None:
    html = world.mallory.get(reverse("portal:dashboard")).content.decode()
    assert "no role or tenant yet" in html
    url = reverse("portal:use_case_detail", args=[world.acme_chatbot.pk])
    assert world.mallory.get(url).status_code == 404


def test_signed_out_visitors_are_sent_to_sign_in(world: World) -> None:
    for url in (
        reverse("portal:dashboard"),
        reverse("portal:review"),
        reverse("portal:use_case_detail", args=[world.acme_chatbot.pk]),
    ):
        response = Client().get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
    post = Client().post(reverse("portal:key_request", args=[world.acme_chatbot.pk]))
    assert post.status_code == 302
    assert not ApiKey.objects.exists()


# --- auditor: reads everything, changes nothing -----------------------------------------
def test_audrey_reads_every_tenant_without_action_buttons(world: World) -> None:
    key, _ = _active_key(world)
    pending = _request_key(world.alice, world.acme_chatbot, name="second")
    dashboard = world.audrey.get(reverse("portal:dashboard")).content.decode()
    assert "Chatbot" in dashboard
    assert "Search" in dashboard
    assert "read-only" in dashboard
    for url in (
        reverse("portal:dashboard"),
        reverse("portal:review"),
        reverse("portal:use_case_detail", args=[world.acme_chatbot.pk]),
        reverse("portal:use_case_detail", args=[world.acme_draft.pk]),
        reverse("portal:key_detail", args=[key.pk]),
        reverse("portal:key_detail", args=[pending.pk]),
    ):
        page = world.audrey.get(url)
        assert page.status_code == 200, url
        assert not _has_post_forms_besides_sign_out(page.content.decode()), url


@pytest.mark.parametrize(
    ("name", "target", "data"),
    [
        ("portal:key_request", "use_case", {"name": "x", "reason": "y"}),
        ("portal:key_decide", "pending", {"decision": "approve"}),
        ("portal:key_reveal", "approved", {}),
        ("portal:key_rotate", "key", {}),
        ("portal:key_revoke", "key", {"reason": "x"}),
        ("portal:use_case_transition", "use_case", {"transition": "suspend", "reason": "x"}),
    ],
)
def test_audrey_cannot_change_anything(world: World, name: str, target: str, data) -> None:
    key, _ = _active_key(world)
    pending = _request_key(world.alice, world.acme_chatbot, name="pending")
    approved = _request_key(world.alice, world.acme_chatbot, name="approved")
    _approve(world.olivia, approved)
    pks = {"use_case": world.acme_chatbot.pk, "key": key.pk, "pending": pending.pk}
    pks["approved"] = approved.pk
    before = AuditEvent.objects.count()

    response = world.audrey.post(reverse(name, args=[pks[target]]), data)
    assert response.status_code == 403
    assert "read-only access" in response.content.decode()
    assert AuditEvent.objects.count() == before
    statuses = dict(ApiKey.objects.values_list("name", "status"))
    assert statuses == {
        "checkout": ApiKeyStatus.ACTIVE,
        "pending": ApiKeyStatus.PENDING,
        "approved": ApiKeyStatus.APPROVED,
    }
    world.acme_chatbot.refresh_from_db()
    assert world.acme_chatbot.status == UseCaseStatus.APPROVED


# --- the edges: CSRF and where a form may send you back to ------------------------------
def test_posts_without_a_csrf_token_are_refused(world: World) -> None:
    from django.contrib.auth import get_user_model

    client = Client(enforce_csrf_checks=True)
    client.force_login(get_user_model().objects.get(username="alice"))
    response = client.post(
        reverse("portal:key_request", args=[world.acme_chatbot.pk]), {"name": "x", "reason": "y"}
    )
    assert response.status_code == 403
    assert not ApiKey.objects.exists()


def test_a_foreign_next_url_is_ignored(world: World) -> None:
    key = _request_key(world.alice, world.acme_chatbot)
    response = world.olivia.post(
        reverse("portal:key_decide", args=[key.pk]),
        {"decision": "approve", "next": "https://evil.example/phish"},
    )
    assert response["Location"] == reverse("portal:review")
