"""What a schemathesis run over /api/ found, pinned down with the plain Django test client.

Deleting a record that others still refer to (a tenant with use cases, a priority class that
rules point at) raised ``ProtectedError`` and answered 500. It is a conflict with the state of
the data, so 409, naming what still refers to the record, and nothing is changed.
"""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from governance.models import AuditEvent, PriorityClass, PriorityRule, Tenant
from governance.roles import Role
from tests.factories import make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client() -> APIClient:
    client = APIClient()
    root: Any = make_user("root", Role.ADMIN)
    client.force_login(root)
    return client


def test_deleting_a_tenant_with_use_cases_is_a_409_naming_them(admin_client: APIClient) -> None:
    acme = make_tenant("acme")
    make_use_case(acme, "chatbot")
    make_use_case(acme, "triage")
    events_before = AuditEvent.objects.count()

    response = admin_client.delete("/api/tenants/acme/")

    assert response.status_code == 409, response.content
    body = response.json()
    assert body["code"] == "protected"
    assert "acme/chatbot" in body["detail"]
    assert sorted(ref["repr"] for ref in body["referenced_by"]) == ["acme/chatbot", "acme/triage"]
    assert {ref["type"] for ref in body["referenced_by"]} == {"use case"}
    assert Tenant.objects.filter(slug="acme").exists()
    assert AuditEvent.objects.count() == events_before  # the delete's audit event rolled back


def test_deleting_a_priority_class_a_rule_uses_is_a_409(admin_client: APIClient) -> None:
    rule = PriorityRule.objects.select_related("priority_class").first()
    assert rule is not None, "the migrations seed the priority matrix"
    name = rule.priority_class.name
    users = PriorityRule.objects.filter(priority_class=rule.priority_class)

    response = admin_client.delete(f"/api/priority-classes/{name}/")

    assert response.status_code == 409, response.content
    body = response.json()
    assert body["code"] == "protected"
    assert sorted(ref["id"] for ref in body["referenced_by"]) == sorted(str(u.pk) for u in users)
    assert {ref["type"] for ref in body["referenced_by"]} == {"priority rule"}
    assert PriorityClass.objects.filter(name=name).exists()


def test_deleting_an_unreferenced_tenant_still_works(admin_client: APIClient) -> None:
    make_tenant("initech")

    response = admin_client.delete("/api/tenants/initech/")

    assert response.status_code == 204, response.content
    assert not Tenant.objects.filter(slug="initech").exists()
