"""Governance records in the Django admin: validated with clear messages, every save audited."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from gateway.policy import SNAPSHOT_KEY, parse_snapshot
from governance.audit import audit_verify
from governance.models import AuditEvent, GuardrailSelection, Tenant, UseCase
from governance.roles import Role
from testkit.factories import (
    PASSWORD,
    make_key,
    make_model,
    make_tenant,
    make_use_case,
    make_user,
)

pytestmark = pytest.mark.django_db

ADMIN_PAGES = [
    "tenant",
    "model",
    "deployment",
    "usecase",
    "priorityclass",
    "priorityrule",
    "ratelimitpolicy",
    "apikey",
    "auditevent",
    "slaclass",
    "fileregistration",
]


@pytest.fixture
def admin_client(client: Client) -> Client:
    root = make_user("root", Role.ADMIN)
    root.is_staff = root.is_superuser = True
    root.save()
    client.login(username="root", password=PASSWORD)
    return client


@pytest.mark.parametrize("page", ADMIN_PAGES)
def test_every_governance_record_has_an_admin_page(admin_client: Client, page: str) -> None:
    assert admin_client.get(f"/admin/governance/{page}/").status_code == 200


def test_bad_values_are_refused_with_a_message_per_field(admin_client: Client) -> None:
    response = admin_client.post(
        "/admin/governance/tenant/add/",
        {
            "slug": "Bad Slug",
            "name": "x",
            "business_unit": "x",
            "application_id": "nope",
            "environment": "prod",
            "owner_email": "not-an-email",
            "contacts": '["also-bad"]',
        },
    )
    assert response.status_code == 200  # the form again, with errors
    html = response.content.decode()
    assert "Use lowercase letters, digits and hyphens" in html
    assert "Use the CMDB form, e.g. APP-1234." in html
    assert "Enter a valid email address." in html
    assert "is not an e-mail address" in html
    assert not Tenant.objects.exists()


def test_an_admin_change_is_audited_with_before_and_after(admin_client: Client) -> None:
    tenant = make_tenant("acme")
    response = admin_client.post(
        f"/admin/governance/tenant/{tenant.pk}/change/",
        {
            "slug": "acme",
            "name": "Acme Corp",
            "business_unit": tenant.business_unit,
            "application_id": tenant.application_id,
            "environment": "prod",
            "owner_email": tenant.owner_email,
            "contacts": "[]",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    event = AuditEvent.objects.get(action="tenant.update")
    assert event.actor == "root"
    assert event.before is not None
    assert event.after is not None
    assert event.before["name"] == "Acme"
    assert event.after["name"] == "Acme Corp"
    assert audit_verify().ok


def test_suspending_from_the_admin_goes_through_the_lifecycle_rules(admin_client: Client) -> None:
    use_case = make_use_case(make_tenant("acme"), "chatbot", models=(make_model("llama"),))
    admin_client.post(
        "/admin/governance/usecase/", {"action": "suspend", "_selected_action": [use_case.pk]}
    )
    use_case.refresh_from_db()
    assert use_case.status == "suspended"
    assert AuditEvent.objects.filter(action="usecase.suspend").exists()
    # Approving a suspended use case is not a legal move: the admin says so and changes nothing.
    response = admin_client.post(
        "/admin/governance/usecase/",
        {"action": "approve", "_selected_action": [use_case.pk]},
        follow=True,
    )
    assert "Cannot approve a use case that is suspended" in response.content.decode()
    assert UseCase.objects.get(pk=use_case.pk).status == "suspended"


# --- every admin write goes through the services: audited, republished, role-checked ------
def _use_case_form(use_case: UseCase, **inline: str) -> dict[str, Any]:
    """The use case's change form as the admin page posts it, with its guardrail inline."""
    fields: dict[str, Any] = {
        "tenant": use_case.tenant.pk,
        "slug": use_case.slug,
        "name": use_case.name,
        "kind": use_case.kind,
        "purpose": use_case.purpose,
        "data_classification": use_case.data_classification,
        "namespace": use_case.namespace,
        "allowed_models": [m.pk for m in use_case.allowed_models.all()],
        "ticket_ref": "",
        "service_account_client_id": "",
        "guardrail_failure": use_case.guardrail_failure,
        "record_policy": use_case.record_policy,
        "record_retention_days": str(use_case.record_retention_days),
        "async_result_ttl_seconds": str(use_case.async_result_ttl_seconds),
        "async_cache_seconds": str(use_case.async_cache_seconds),
        # Check boxes: present when ticked.
        **(
            {"records_visible_to_developers": "on"}
            if use_case.records_visible_to_developers
            else {}
        ),
        **({"legal_hold": "on"} if use_case.legal_hold else {}),
        "guardrails-TOTAL_FORMS": str(use_case.guardrails.count()),
        "guardrails-INITIAL_FORMS": str(use_case.guardrails.count()),
        "guardrails-MIN_NUM_FORMS": "0",
        "guardrails-MAX_NUM_FORMS": "1000",
    }
    for index, selection in enumerate(use_case.guardrails.order_by("pk")):
        prefix = f"guardrails-{index}-"
        fields |= {
            f"{prefix}id": selection.pk,
            f"{prefix}use_case": use_case.pk,
            f"{prefix}guardrail": selection.guardrail,
            f"{prefix}side": selection.side,
            f"{prefix}action": selection.action,
            f"{prefix}config": json.dumps(selection.config),
            f"{prefix}position": str(selection.position),
        }
    return fields | inline


def test_a_guardrail_edited_in_the_admin_inline_is_audited_and_republished(
    admin_client: Client,
    live_valkey_settings,
    valkey_client,
    django_capture_on_commit_callbacks,
    company_guardrails,
) -> None:
    """GIVEN acme/chatbot redacting the company's word list in requests
    WHEN root makes it block, and adds a prompt-length flag, in the use case's inline
    THEN both are audited with before and after, and the gateway's snapshot says so."""
    use_case = make_use_case(make_tenant("acme"), "chatbot", models=(make_model("llama"),))
    GuardrailSelection.objects.create(
        use_case=use_case,
        guardrail="wordlist",
        side="request",
        action="redact",
        config={"words": ["falcon"], "case_sensitive": False},
    )
    form = _use_case_form(
        use_case,
        **{
            "guardrails-0-action": "block",
            "guardrails-TOTAL_FORMS": "2",
            "guardrails-1-use_case": str(use_case.pk),
            "guardrails-1-guardrail": "prompt_length",
            "guardrails-1-side": "request",
            "guardrails-1-action": "flag",
            "guardrails-1-config": "{}",
        },
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(f"/admin/governance/usecase/{use_case.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[:3000]

    update = AuditEvent.objects.get(action="guardrailselection.update")
    assert update.before is not None
    assert update.after is not None
    assert (update.before["action"], update.after["action"]) == ("redact", "block")
    assert update.actor == "root"
    created = AuditEvent.objects.get(action="guardrailselection.create")
    assert created.after is not None
    assert created.after["guardrail"] == "prompt_length"
    # Its settings as the detector completed them, and its place after the first.
    assert created.after["config"] == {"max_chars": 4000}
    assert created.after["position"] == 1
    assert audit_verify().ok
    snapshot = parse_snapshot(valkey_client.get(SNAPSHOT_KEY))
    published = [(g.guardrail, g.action) for g in snapshot.use_cases[use_case.pk].guardrails]
    assert published == [("wordlist", "block"), ("prompt_length", "flag")]


def test_a_bad_guardrail_setting_in_the_admin_is_an_error_beside_its_field(
    admin_client: Client, company_guardrails
) -> None:
    use_case = make_use_case(make_tenant("acme"), "chatbot", models=(make_model("llama"),))
    form = _use_case_form(
        use_case,
        **{
            "guardrails-TOTAL_FORMS": "1",
            "guardrails-0-use_case": str(use_case.pk),
            "guardrails-0-guardrail": "wordlist",
            "guardrails-0-side": "request",
            "guardrails-0-action": "redact",
            "guardrails-0-config": json.dumps({"words": []}),
        },
    )
    response = admin_client.post(f"/admin/governance/usecase/{use_case.pk}/change/", form)
    assert response.status_code == 200
    assert "words: give a non-empty list of words." in response.content.decode()
    assert not GuardrailSelection.objects.exists()
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_a_guardrail_deleted_in_the_admin_inline_is_audited(admin_client: Client) -> None:
    use_case = make_use_case(make_tenant("acme"), "chatbot", models=(make_model("llama"),))
    GuardrailSelection.objects.create(
        use_case=use_case, guardrail="pii", side="request", action="redact"
    )
    form = _use_case_form(use_case, **{"guardrails-0-DELETE": "on"})
    response = admin_client.post(f"/admin/governance/usecase/{use_case.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[:3000]
    assert not GuardrailSelection.objects.exists()
    deleted = AuditEvent.objects.get(action="guardrailselection.delete")
    assert deleted.before is not None
    assert deleted.before["action"] == "redact"


def test_a_staff_account_without_a_switchyard_role_changes_nothing_in_the_admin(
    client: Client,
) -> None:
    """mallory is staff with every governance permission, but holds no Switchyard role: the
    services refuse her writes, as they would on any other door."""
    tenant = make_tenant("acme")
    mallory = make_user("mallory")
    mallory.is_staff = True
    mallory.save()
    mallory.user_permissions.set(Permission.objects.filter(content_type__app_label="governance"))
    client.login(username="mallory", password=PASSWORD)
    response = client.post(
        f"/admin/governance/tenant/{tenant.pk}/change/",
        {
            "slug": "acme",
            "name": "Mallory's now",
            "business_unit": tenant.business_unit,
            "application_id": tenant.application_id,
            "environment": "prod",
            "owner_email": tenant.owner_email,
            "contacts": "[]",
        },
    )
    assert response.status_code == 403
    assert Tenant.objects.get(pk=tenant.pk).name == "Acme"
    assert not AuditEvent.objects.filter(action="tenant.update").exists()


def test_a_key_cannot_be_moved_to_another_use_case_in_the_admin(admin_client: Client) -> None:
    acme = make_tenant("acme")
    chatbot = make_use_case(acme, "chatbot")
    other = make_use_case(make_tenant("globex"), "search")
    key, _ = make_key(chatbot)
    admin_client.post(
        f"/admin/governance/apikey/{key.pk}/change/",
        {"use_case": other.pk, "name": key.name, "reason": key.reason, "expires_at_0": ""},
    )
    key.refresh_from_db()
    assert key.use_case == chatbot


def test_a_tenant_added_in_the_admin_is_created_through_the_services(admin_client: Client) -> None:
    member = make_user("alice", Role.DEVELOPER)
    response = admin_client.post(
        "/admin/governance/tenant/add/",
        {
            "slug": "initech",
            "name": "Initech",
            "business_unit": "BU",
            "application_id": "APP-9",
            "environment": "uat",
            "owner_email": "o@initech.example",
            "contacts": "[]",
            "members": [member.pk],
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    tenant = Tenant.objects.get(slug="initech")
    assert list(tenant.members.all()) == [member]
    created = AuditEvent.objects.get(action="tenant.create")
    assert created.after is not None
    assert created.after["members"] == [member.pk]  # audited with its many-to-many fields
