"""The use case page's record settings and legal holds: everyone who sees the use case reads
them; officers change them, through the services, with CSRF and server-side checks.

Personas: alice develops for acme, bob for globex, olivia is an officer, audrey an auditor.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import unescape

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from governance.models import AuditEvent, Tenant, UseCase
from governance.roles import Role
from testkit.factories import make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db


@dataclass
class World:
    chatbot: UseCase
    alice: Client
    bob: Client
    olivia: Client
    audrey: Client


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def world() -> World:
    acme, globex = make_tenant("acme"), make_tenant("globex")
    return World(
        chatbot=make_use_case(acme, "chatbot"),
        alice=_client_for(make_user("alice", Role.DEVELOPER, tenants=(acme,))),
        bob=_client_for(make_user("bob", Role.DEVELOPER, tenants=(globex,))),
        olivia=_client_for(make_user("olivia", Role.OFFICER)),
        audrey=_client_for(make_user("audrey", Role.AUDITOR)),
    )


def _page(client: Client, use_case: UseCase) -> str:
    response = client.get(reverse("portal:use_case_detail", args=[use_case.pk]))
    assert response.status_code == 200
    return unescape(response.content.decode())


def _settings_shown(page: str) -> str:
    start = page.index('id="record-settings"')
    return page[start : page.index("</dl>", start)]


def _records_url(world: World) -> str:
    return reverse("portal:use_case_records", args=[world.chatbot.pk])


def _hold_url(world: World) -> str:
    return reverse("portal:use_case_legal_hold", args=[world.chatbot.pk])


@pytest.mark.parametrize("who", ["alice", "audrey", "olivia"])
def test_everyone_who_sees_the_use_case_reads_its_record_settings(world: World, who: str) -> None:
    shown = _settings_shown(_page(getattr(world, who), world.chatbot))
    assert "Metadata: who, when, model, tokens, status, latency, findings" in shown
    assert "90 days" in shown
    assert '<dt>Legal hold</dt><dd id="legal-hold">none</dd>' in shown


@pytest.mark.parametrize("who", ["alice", "audrey"])
def test_only_officers_see_the_forms(world: World, who: str) -> None:
    assert 'id="record-settings-form"' not in _page(getattr(world, who), world.chatbot)
    officer_page = _page(world.olivia, world.chatbot)
    assert 'id="record-settings-form"' in officer_page
    assert 'id="tenant-hold-form"' in officer_page


def test_an_officer_turns_records_to_full_and_the_change_is_audited(world: World) -> None:
    response = world.olivia.post(
        _records_url(world),
        {
            "record_policy": "full",
            "record_retention_days": "30",
            "records_visible_to_developers": "on",
        },
    )
    assert response.status_code == 302
    chatbot = UseCase.objects.get(pk=world.chatbot.pk)
    assert (chatbot.record_policy, chatbot.record_retention_days) == ("full", 30)
    assert chatbot.records_visible_to_developers
    event = AuditEvent.objects.get(action="usecase.update")
    assert event.actor == "olivia"
    assert event.after is not None
    assert event.after["record_policy"] == "full"
    shown = _settings_shown(_page(world.alice, world.chatbot))
    assert "Full: metadata plus the request and the response, after redaction" in shown
    assert "30 days" in shown


@pytest.mark.parametrize(
    ("posted", "message"),
    [
        ({"record_policy": "everything", "record_retention_days": "30"}, "Select a valid choice"),
        ({"record_policy": "full", "record_retention_days": "0"}, "greater than or equal to 1"),
        ({"record_policy": "full", "record_retention_days": "soon"}, "Enter a whole number"),
    ],
)
def test_a_bad_setting_is_refused_with_a_message_and_nothing_changes(
    world: World, posted: dict[str, str], message: str
) -> None:
    response = world.olivia.post(_records_url(world), posted)
    assert response.status_code == 302
    shown = [str(m) for m in get_messages(response.wsgi_request)]
    assert any(message in text for text in shown), shown
    assert UseCase.objects.get(pk=world.chatbot.pk).record_policy == "metadata"
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


@pytest.mark.parametrize("who", ["alice", "audrey"])
def test_developers_and_auditors_are_refused_the_record_settings_and_holds(
    world: World, who: str
) -> None:
    client = getattr(world, who)
    refused = client.post(
        _records_url(world), {"record_policy": "none", "record_retention_days": "1"}
    )
    held = client.post(_hold_url(world), {"target": "tenant", "hold": "place", "reason": "r"})
    assert refused.status_code == 403
    assert held.status_code == 403
    assert UseCase.objects.get(pk=world.chatbot.pk).record_policy == "metadata"
    assert not Tenant.objects.get(slug="acme").legal_hold


def test_a_use_case_outside_ones_tenants_is_not_found(world: World) -> None:
    response = world.bob.post(
        _records_url(world), {"record_policy": "none", "record_retention_days": "1"}
    )
    assert response.status_code == 404


def test_an_officer_places_the_tenant_hold_from_the_use_case_page_and_lifts_it(
    world: World,
) -> None:
    placed = world.olivia.post(
        _hold_url(world), {"target": "tenant", "hold": "place", "reason": "Regulator inquiry"}
    )
    assert placed.status_code == 302
    assert Tenant.objects.get(slug="acme").legal_hold
    shown = _settings_shown(_page(world.audrey, world.chatbot))
    assert "on the tenant acme" in shown

    world.olivia.post(_hold_url(world), {"target": "tenant", "hold": "lift", "reason": "Closed"})
    assert not Tenant.objects.get(slug="acme").legal_hold
    assert [
        (e.action, e.after)
        for e in AuditEvent.objects.filter(action__contains="legal_hold").order_by("sequence")
    ] == [
        ("tenant.legal_hold_place", {"legal_hold": True, "reason": "Regulator inquiry"}),
        ("tenant.legal_hold_lift", {"legal_hold": False, "reason": "Closed"}),
    ]


def test_a_use_case_hold_needs_a_reason(world: World) -> None:
    refused = world.olivia.post(
        _hold_url(world), {"target": "use_case", "hold": "place", "reason": ""}
    )
    shown = [str(m) for m in get_messages(refused.wsgi_request)]
    assert any("Reason: This field is required." in text for text in shown), shown
    assert not UseCase.objects.get(pk=world.chatbot.pk).legal_hold

    world.olivia.post(_hold_url(world), {"target": "use_case", "hold": "place", "reason": "M-1"})
    assert UseCase.objects.get(pk=world.chatbot.pk).legal_hold
    assert "on this use case" in _settings_shown(_page(world.alice, world.chatbot))


def test_the_forms_need_a_csrf_token(world: World) -> None:
    from django.contrib.auth import get_user_model

    client = Client(enforce_csrf_checks=True)
    client.force_login(get_user_model().objects.get(username="olivia"))
    records = client.post(
        _records_url(world), {"record_policy": "none", "record_retention_days": "1"}
    )
    hold = client.post(_hold_url(world), {"target": "use_case", "hold": "place", "reason": "r"})
    assert (records.status_code, hold.status_code) == (403, 403)
    chatbot = UseCase.objects.get(pk=world.chatbot.pk)
    assert chatbot.record_policy == "metadata"
    assert not chatbot.legal_hold
