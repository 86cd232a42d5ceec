"""An officer creates and edits tenants in the portal: form, plan, apply — through the services.

Personas: olivia is a governance officer; alice a developer of acme, audrey an auditor,
mallory has an account and no role.
"""

from __future__ import annotations

import pytest
from django.test import Client

from gateway.policy import VERSION_KEY
from governance.models import AuditEvent, Tenant
from governance.roles import Role
from testkit.factories import make_tenant
from tests.portal.test_officer_support import (
    apply,
    client_for,
    fingerprint,
    plan_cells,
    review,
    text,
    url,
)

pytestmark = pytest.mark.django_db

NEWCO = {
    "slug": "newco",
    "name": "NewCo Payments",
    "business_unit": "Retail banking",
    "application_id": "APP-4242",
    "environment": "uat",
    "owner_email": "owner@newco.example",
    "contacts": "ops@newco.example\nrisk@newco.example",
}


@pytest.fixture
def olivia():
    return client_for("olivia", Role.OFFICER)


def test_review_lists_exactly_the_new_tenant_and_writes_nothing(olivia) -> None:
    html = review(olivia, url("tenant_new"), NEWCO)

    cells = {(c.action, c.path, c.field): (c.before, c.after) for c in plan_cells(html)}
    assert cells == {
        ("create", "tenants[newco]", "name"): ("—", '"NewCo Payments"'),
        ("create", "tenants[newco]", "business_unit"): ("—", '"Retail banking"'),
        ("create", "tenants[newco]", "application_id"): ("—", '"APP-4242"'),
        ("create", "tenants[newco]", "environment"): ("—", '"uat"'),
        ("create", "tenants[newco]", "owner_email"): ("—", '"owner@newco.example"'),
        ("create", "tenants[newco]", "contacts"): (
            "—",
            '["ops@newco.example", "risk@newco.example"]',
        ),
        ("create", "tenants[newco]", "legal_hold"): ("—", "false"),
    }
    assert not Tenant.objects.filter(slug="newco").exists()
    assert not AuditEvent.objects.exists()  # the rehearsal of the apply was rolled back


def test_apply_creates_the_tenant_through_the_services_audited_and_published(
    olivia, settings, valkey_url, valkey_client, django_capture_on_commit_callbacks
) -> None:
    settings.VALKEY_URL = valkey_url
    html = review(olivia, url("tenant_new"), NEWCO)

    with django_capture_on_commit_callbacks(execute=True):
        response = apply(olivia, url("tenant_new"), NEWCO, html)

    assert response.status_code == 302
    assert response["Location"] == url("governance")
    tenant = Tenant.objects.get(slug="newco")
    assert (tenant.name, tenant.environment, tenant.application_id) == (
        "NewCo Payments",
        "uat",
        "APP-4242",
    )
    assert tenant.contacts == ["ops@newco.example", "risk@newco.example"]
    event = AuditEvent.objects.get()
    assert (event.action, event.actor, event.object_repr) == (
        "tenant.create",
        "olivia",
        str(tenant),
    )
    assert int(valkey_client.get(VERSION_KEY)) == 1  # the gateway's snapshot republished


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("owner_email", "not-an-address", "valid email"),
        ("application_id", "not a cmdb id!", "cmdb"),
        ("slug", "Bad_Slug", "lowercase"),
        ("contacts", "ops@newco.example\nnobody", "valid email"),
    ],
)
def test_invalid_input_shows_the_fields_error_and_writes_nothing(
    olivia, field, value, message
) -> None:
    response = olivia.post(url("tenant_new"), {**NEWCO, field: value, "step": "review"})

    assert response.status_code == 200
    form = response.context["form"]
    assert field in form.errors, form.errors
    assert message in " ".join(form.errors[field]).lower()
    assert 'id="plan"' not in response.content.decode()
    assert not Tenant.objects.filter(slug=NEWCO["slug"]).exists()
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_apply_with_invalid_input_writes_nothing(olivia) -> None:
    html = review(olivia, url("tenant_new"), NEWCO)

    response = olivia.post(
        url("tenant_new"),
        {**NEWCO, "owner_email": "broken", "step": "apply", "fingerprint": fingerprint(html)},
    )

    assert response.status_code == 200
    assert "owner_email" in response.context["form"].errors
    assert not Tenant.objects.filter(slug="newco").exists()


def test_edit_shows_before_and_after_and_applies_only_that(olivia) -> None:
    make_tenant("acme", name="Acme", environment="prod")
    data = {**NEWCO, "slug": "ignored", "name": "Acme Retail", "environment": "prod"}
    data.update(application_id="APP-1000", owner_email="owner@acme.example", contacts="")
    html = review(olivia, url("tenant_edit", "acme"), data)

    assert [(c.action, c.path, c.field, c.before, c.after) for c in plan_cells(html)] == [
        ("update", "tenants[acme]", "name", '"Acme"', '"Acme Retail"'),
        ("update", "tenants[acme]", "business_unit", '"Acme BU"', '"Retail banking"'),
    ]
    response = apply(olivia, url("tenant_edit", "acme"), data, html)

    assert response.status_code == 302
    tenant = Tenant.objects.get(slug="acme")  # the id field is not editable: "ignored" is
    assert (tenant.name, tenant.business_unit) == ("Acme Retail", "Retail banking")
    event = AuditEvent.objects.get()
    assert event.action == "tenant.update"
    assert event.before is not None
    assert event.after is not None
    assert event.before["name"] == "Acme"
    assert event.after["name"] == "Acme Retail"


def test_a_plan_that_changed_since_review_is_not_applied(olivia) -> None:
    make_tenant("acme", name="Acme")
    data = {**NEWCO, "slug": "acme", "name": "Acme Retail"}
    html = review(olivia, url("tenant_edit", "acme"), data)
    Tenant.objects.filter(slug="acme").update(name="Acme Renamed Meanwhile")

    response = apply(olivia, url("tenant_edit", "acme"), data, html)

    assert response.status_code == 200
    assert "changed since you reviewed" in text(response.content.decode())
    assert Tenant.objects.get(slug="acme").name == "Acme Renamed Meanwhile"
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))
    # … and the page shows the new plan, from what the records say now.
    assert ("name", '"Acme Renamed Meanwhile"', '"Acme Retail"') in [
        (c.field, c.before, c.after) for c in plan_cells(response.content.decode())
    ]


def test_back_to_the_form_keeps_what_was_typed(olivia) -> None:
    response = olivia.post(url("tenant_new"), {**NEWCO, "step": "edit"})

    assert response.status_code == 200
    assert 'value="NewCo Payments"' in response.content.decode()
    assert not Tenant.objects.exists()


@pytest.mark.parametrize(
    ("username", "role"),
    [("alice", Role.DEVELOPER), ("audrey", Role.AUDITOR), ("mallory", None)],
)
@pytest.mark.parametrize("method", ["get", "post"])
def test_only_officers_may_use_the_tenant_forms(username, role, method) -> None:
    acme = make_tenant("acme")
    client = client_for(username, *([role] if role else []), tenants=(acme,))
    for target in (url("tenant_new"), url("tenant_edit", "acme"), url("governance")):
        data = {**NEWCO, "step": "apply"} if method == "post" else None
        response = getattr(client, method)(target, data)
        assert response.status_code == 403, target
    assert Tenant.objects.count() == 1
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_signed_out_people_are_sent_to_sign_in(client) -> None:
    response = client.get(url("tenant_new"))

    assert response.status_code == 302
    assert "/accounts/login/" in response["Location"]


def test_admins_may_use_the_forms_too() -> None:
    from django.contrib.auth import get_user_model

    root = get_user_model().objects.create_superuser("root", "root@example.invalid", "pw")
    client = Client()
    client.force_login(root)

    html = review(client, url("tenant_new"), NEWCO)
    apply(client, url("tenant_new"), NEWCO, html)

    assert AuditEvent.objects.get(action="tenant.create").actor == "root"
