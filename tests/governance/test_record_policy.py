"""Record policies and legal holds: who may set them, how they are checked, what the trail keeps.

Personas: alice develops for acme, olivia is an officer, audrey an auditor, root an admin.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from rest_framework.test import APIClient

from gateway.policy import SNAPSHOT_KEY
from governance.audit import Actor, audit_verify
from governance.models import AuditEvent, Tenant, UseCase
from governance.roles import Role
from governance.selectors import legal_hold_reason
from governance.services.generic_records import record_update
from governance.services.record_bounds import RETENTION_DAYS_MAX
from governance.services.record_policy import (
    tenant_set_legal_hold,
    use_case_set_legal_hold,
    use_case_set_records,
)
from governance.services.use_cases import use_case_create, use_case_update
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    acme = make_tenant("acme")
    people = {
        "alice": make_user("alice", Role.DEVELOPER, tenants=(acme,)),
        "olivia": make_user("olivia", Role.OFFICER),
        "audrey": make_user("audrey", Role.AUDITOR),
        "root": make_user("root", Role.ADMIN),
    }
    chatbot = make_use_case(acme, "chatbot", models=(make_model("llama"),))
    return {
        "acme": acme,
        "chatbot": chatbot,
        "users": people,
        **{name: Actor.for_user(user) for name, user in people.items()},
    }


# --- the services ---------------------------------------------------------------------------
def test_a_new_use_case_records_metadata_for_90_days_unseen_by_developers(world) -> None:
    created = use_case_create(
        actor=world["alice"],
        tenant=world["acme"],
        fields={"slug": "triage", "name": "Triage", "kind": "extraction", "purpose": "p"},
    )
    assert (created.record_policy, created.record_retention_days) == ("metadata", 90)
    assert not created.records_visible_to_developers
    assert not created.legal_hold


def test_an_officer_sets_the_record_settings_audited_before_and_after_and_republished(
    world, live_valkey_settings, valkey_client, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        use_case_set_records(
            actor=world["olivia"],
            use_case=world["chatbot"],
            policy="full",
            retention_days=30,
            developers_can_read=True,
        )

    chatbot = UseCase.objects.get(pk=world["chatbot"].pk)
    assert (chatbot.record_policy, chatbot.record_retention_days) == ("full", 30)
    assert chatbot.records_visible_to_developers
    event = AuditEvent.objects.get(action="usecase.update")
    assert event.actor == "olivia"
    assert event.before is not None
    assert event.after is not None
    assert (event.before["record_policy"], event.after["record_policy"]) == ("metadata", "full")
    assert (event.before["record_retention_days"], event.after["record_retention_days"]) == (
        90,
        30,
    )
    assert valkey_client.exists(SNAPSHOT_KEY), "the gateway's snapshot was not republished"
    assert audit_verify().ok


def test_setting_only_the_retention_leaves_the_policy_and_an_unchanged_setting_is_not_audited(
    world,
) -> None:
    use_case_set_records(actor=world["root"], use_case=world["chatbot"], retention_days=7)
    use_case_set_records(actor=world["root"], use_case=world["chatbot"], retention_days=7)

    chatbot = UseCase.objects.get(pk=world["chatbot"].pk)
    assert (chatbot.record_policy, chatbot.record_retention_days) == ("metadata", 7)
    assert AuditEvent.objects.filter(action="usecase.update").count() == 1


@pytest.mark.parametrize("who", ["alice", "audrey"])
def test_developers_and_auditors_may_not_set_record_settings(world, who: str) -> None:
    with pytest.raises(PermissionDenied, match="officer"):
        use_case_set_records(actor=world[who], use_case=world["chatbot"], policy="full")
    assert UseCase.objects.get(pk=world["chatbot"].pk).record_policy == "metadata"


def test_a_developer_cannot_turn_records_up_through_a_draft_update_either(world) -> None:
    """A draft of alice's tenant: she may edit its purpose, not its records."""
    draft = make_use_case(world["acme"], "draft", status="draft")
    with pytest.raises(PermissionDenied, match="record_policy"):
        use_case_update(actor=world["alice"], use_case=draft, changes={"record_policy": "none"})
    with pytest.raises(PermissionDenied, match="records_visible_to_developers"):
        use_case_create(
            actor=world["alice"],
            tenant=world["acme"],
            fields={
                "slug": "sneaky",
                "name": "S",
                "kind": "chatbot",
                "purpose": "p",
                "records_visible_to_developers": True,
            },
        )


@pytest.mark.parametrize(
    ("settings_", "field", "message"),
    [
        ({"policy": "everything"}, "record_policy", "Choose one of none, metadata, full"),
        ({"retention_days": 0}, "record_retention_days", "from 1 to"),
        ({"retention_days": RETENTION_DAYS_MAX + 1}, "record_retention_days", "from 1 to"),
        ({"retention_days": True}, "record_retention_days", "whole number"),
    ],
)
def test_bad_record_settings_are_refused_with_the_field_named(
    world, settings_: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        use_case_set_records(actor=world["olivia"], use_case=world["chatbot"], **settings_)
    assert message in " ".join(refused.value.message_dict[field])
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_a_legal_hold_placed_and_lifted_is_audited_with_each_reason(world) -> None:
    held = use_case_set_legal_hold(
        actor=world["olivia"], use_case=world["chatbot"], hold=True, reason="Matter 42"
    )
    assert held.legal_hold
    assert legal_hold_reason(held) == "Matter 42"
    lifted = use_case_set_legal_hold(
        actor=world["root"], use_case=world["chatbot"], hold=False, reason="Matter 42 closed"
    )
    assert not lifted.legal_hold
    assert legal_hold_reason(lifted) == ""

    events = list(
        AuditEvent.objects.filter(action__startswith="usecase.legal_hold").order_by("sequence")
    )
    assert [(e.action, e.actor, e.after) for e in events] == [
        ("usecase.legal_hold_place", "olivia", {"legal_hold": True, "reason": "Matter 42"}),
        ("usecase.legal_hold_lift", "root", {"legal_hold": False, "reason": "Matter 42 closed"}),
    ]
    assert all(e.tenant_slug == "acme" for e in events)
    assert audit_verify().ok


def test_a_tenant_hold_is_audited_and_placing_it_twice_records_it_once(world) -> None:
    for _ in range(2):
        tenant_set_legal_hold(
            actor=world["olivia"], tenant=world["acme"], hold=True, reason="Regulator inquiry"
        )
    assert Tenant.objects.get(slug="acme").legal_hold
    event = AuditEvent.objects.get(action="tenant.legal_hold_place")
    assert event.after == {"legal_hold": True, "reason": "Regulator inquiry"}
    assert event.tenant_slug == "acme"


@pytest.mark.parametrize("hold", [True, False])
def test_a_hold_without_a_reason_is_refused(world, hold: bool) -> None:
    if not hold:
        use_case_set_legal_hold(
            actor=world["olivia"], use_case=world["chatbot"], hold=True, reason="x"
        )
    with pytest.raises(ValidationError) as refused:
        use_case_set_legal_hold(
            actor=world["olivia"], use_case=world["chatbot"], hold=hold, reason="  "
        )
    assert "Say why" in refused.value.message_dict["reason"][0]
    assert UseCase.objects.get(pk=world["chatbot"].pk).legal_hold is not hold


@pytest.mark.parametrize("who", ["alice", "audrey"])
def test_developers_and_auditors_may_not_place_or_lift_holds(world, who: str) -> None:
    with pytest.raises(PermissionDenied):
        use_case_set_legal_hold(actor=world[who], use_case=world["chatbot"], hold=True, reason="r")
    with pytest.raises(PermissionDenied):
        tenant_set_legal_hold(actor=world[who], tenant=world["acme"], hold=True, reason="r")
    assert not AuditEvent.objects.filter(action__contains="legal_hold").exists()


def test_the_generic_doors_never_move_a_hold(world) -> None:
    """A form or a file that writes a whole record must not drop (or place) a hold silently."""
    tenant_set_legal_hold(actor=world["olivia"], tenant=world["acme"], hold=True, reason="r")
    acme = Tenant.objects.get(slug="acme")
    acme.legal_hold = False
    with pytest.raises(ValidationError, match="own action"):
        record_update(actor=world["olivia"], instance=acme, changes={"name": "Acme"})
    with pytest.raises(ValidationError, match="own action"):
        use_case_update(
            actor=world["olivia"], use_case=world["chatbot"], changes={"legal_hold": True}
        )
    assert Tenant.objects.get(slug="acme").legal_hold


# --- the API ----------------------------------------------------------------------------------
@pytest.fixture
def api(world):
    clients = {}
    for name, user in world["users"].items():
        client = APIClient()
        client.force_authenticate(user)
        clients[name] = client
    return clients


def test_the_api_shows_the_record_fields_and_officers_change_them(world, api) -> None:
    url = f"/api/use-cases/{world['chatbot'].pk}/"
    shown = api["alice"].get(url).data
    assert {k: shown[k] for k in ("record_policy", "record_retention_days")} == {
        "record_policy": "metadata",
        "record_retention_days": 90,
    }
    assert shown["records_visible_to_developers"] is False
    assert shown["legal_hold"] is False

    changed = api["olivia"].patch(
        url, {"record_policy": "full", "record_retention_days": 14}, format="json"
    )
    assert changed.status_code == 200, changed.data
    assert (changed.data["record_policy"], changed.data["record_retention_days"]) == ("full", 14)
    assert AuditEvent.objects.filter(action="usecase.update", actor="olivia").exists()


def test_the_api_refuses_developers_record_changes_and_bad_values(world, api) -> None:
    url = f"/api/use-cases/{world['chatbot'].pk}/"
    refused = api["alice"].patch(url, {"record_policy": "none"}, format="json")
    assert refused.status_code == 403
    assert "Only an officer" in refused.data["detail"]
    bad = api["olivia"].patch(url, {"record_retention_days": 0}, format="json")
    assert bad.status_code == 400
    assert "record_retention_days" in bad.data
    silent = api["olivia"].patch(url, {"legal_hold": True}, format="json")
    assert silent.status_code == 200
    assert silent.data["legal_hold"] is False  # read-only here: the hold has its own action
    assert UseCase.objects.get(pk=world["chatbot"].pk).record_policy == "metadata"


def test_the_api_places_and_lifts_holds_on_use_cases_and_tenants_with_a_reason(world, api) -> None:
    use_case_url = f"/api/use-cases/{world['chatbot'].pk}/legal-hold/"
    placed = api["olivia"].post(use_case_url, {"hold": True, "reason": "Matter 7"}, format="json")
    assert placed.status_code == 200, placed.data
    assert placed.data["legal_hold"] is True
    tenant = api["root"].post(
        "/api/tenants/acme/legal-hold/", {"hold": True, "reason": "Audit 2026"}, format="json"
    )
    assert tenant.status_code == 200, tenant.data
    assert tenant.data["legal_hold"] is True
    lifted = api["olivia"].post(
        use_case_url, {"hold": False, "reason": "Matter 7 closed"}, format="json"
    )
    assert lifted.data["legal_hold"] is False
    assert list(
        AuditEvent.objects.filter(action__contains="legal_hold")
        .order_by("sequence")
        .values_list("action", flat=True)
    ) == ["usecase.legal_hold_place", "tenant.legal_hold_place", "usecase.legal_hold_lift"]


def test_the_api_refuses_a_hold_without_a_reason_and_from_developers_and_auditors(
    world, api
) -> None:
    url = f"/api/use-cases/{world['chatbot'].pk}/legal-hold/"
    missing = api["olivia"].post(url, {"hold": True}, format="json")
    assert missing.status_code == 400
    assert "reason" in missing.data
    blank = api["olivia"].post(url, {"hold": True, "reason": " "}, format="json")
    assert blank.status_code == 400
    for who in ("alice", "audrey"):
        assert api[who].post(url, {"hold": True, "reason": "r"}, format="json").status_code == 403
        tenant = api[who].post(
            "/api/tenants/acme/legal-hold/", {"hold": True, "reason": "r"}, format="json"
        )
        assert tenant.status_code in (403, 404)  # 404: a tenant outside one's scope
    assert not UseCase.objects.get(pk=world["chatbot"].pk).legal_hold
    assert not Tenant.objects.get(slug="acme").legal_hold


# --- the admin --------------------------------------------------------------------------------
def _tenant_form(tenant: Tenant, **changes: str) -> dict[str, object]:
    return {
        "slug": tenant.slug,
        "name": tenant.name,
        "business_unit": tenant.business_unit,
        "application_id": tenant.application_id,
        "environment": tenant.environment,
        "owner_email": tenant.owner_email,
        "contacts": "[]",
        **changes,
    }


def test_the_admin_places_a_tenant_hold_through_the_service_only_with_a_reason(
    world, client
) -> None:
    root = world["users"]["root"]
    root.is_staff = root.is_superuser = True
    root.save()
    client.force_login(root)
    url = f"/admin/governance/tenant/{world['acme'].pk}/change/"
    without = client.post(url, _tenant_form(world["acme"], legal_hold="on"))
    assert without.status_code == 200  # the form again, with the error beside the reason
    assert "Say why you are placing the legal hold." in without.content.decode()
    assert not Tenant.objects.get(slug="acme").legal_hold

    done = client.post(
        url, _tenant_form(world["acme"], legal_hold="on", legal_hold_reason="Subpoena 9")
    )
    assert done.status_code == 302, done.content.decode()[:2000]
    assert Tenant.objects.get(slug="acme").legal_hold
    event = AuditEvent.objects.get(action="tenant.legal_hold_place")
    assert (event.actor, event.after) == ("root", {"legal_hold": True, "reason": "Subpoena 9"})


def test_the_admin_sets_record_settings_and_lifts_a_use_case_hold_through_the_services(
    world, client
) -> None:
    """GIVEN acme/chatbot on hold WHEN root, in the admin, records it in full and clears the
    hold with a reason THEN both are audited: the settings as an update, the hold as a lift."""
    from tests.governance.test_admin import _use_case_form

    use_case_set_legal_hold(actor=world["olivia"], use_case=world["chatbot"], hold=True, reason="M")
    root = world["users"]["root"]
    root.is_staff = root.is_superuser = True
    root.save()
    client.force_login(root)
    chatbot = UseCase.objects.get(pk=world["chatbot"].pk)
    form = _use_case_form(chatbot, record_policy="full", legal_hold_reason="Matter closed")
    del form["legal_hold"]  # the box cleared

    response = client.post(f"/admin/governance/usecase/{chatbot.pk}/change/", form)

    assert response.status_code == 302, response.content.decode()[:3000]
    chatbot.refresh_from_db()
    assert chatbot.record_policy == "full"
    assert not chatbot.legal_hold
    update = AuditEvent.objects.get(action="usecase.update")
    assert update.after is not None
    assert update.after["record_policy"] == "full"
    assert update.after["legal_hold"] is True  # the update never moved the hold…
    lift = AuditEvent.objects.get(action="usecase.legal_hold_lift")  # …the lift did
    assert (lift.actor, lift.after) == ("root", {"legal_hold": False, "reason": "Matter closed"})
