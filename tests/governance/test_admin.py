"""Governance records in the Django admin: validated with clear messages, every save audited."""

from __future__ import annotations

import pytest
from django.test import Client

from governance.audit import audit_verify
from governance.models import AuditEvent, Tenant, UseCase
from governance.roles import Role
from tests.factories import PASSWORD, make_model, make_tenant, make_use_case, make_user

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
