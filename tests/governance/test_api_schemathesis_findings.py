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
from testkit.factories import make_tenant, make_use_case, make_user

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


@pytest.mark.parametrize(
    "bound",
    [
        # PostgreSQL takes offsets up to ±15:59 only; ISO 8601 (and Python) allow ±23:59.
        "2026-01-28T23:15:39-17:00",
        "0170-01-28T23:15:39+23:30",
        # Valid as written, out of datetime's range once taken to UTC.
        "0001-01-01T00:00:00+01:00",
    ],
)
def test_a_time_filter_with_an_extreme_offset_is_answered_not_a_500(
    admin_client: APIClient, bound: str
) -> None:
    """GIVEN a time bound whose offset the database cannot take as written
    WHEN the admission decisions are filtered by it
    THEN the answer is a plain 200 (the bound, taken to UTC) or a 400 naming the filter."""
    response = admin_client.get("/api/admission-decisions/", {"occurred_at__gte": bound})

    assert response.status_code in (200, 400), response.content
    if response.status_code == 400:
        assert "occurred_at__gte" in response.json()


def test_a_time_filter_is_compared_in_utc(admin_client: APIClient) -> None:
    """An offset bound means the same instant as its UTC spelling: a decision stamped at
    12:00 UTC is found by '>= 13:30+01:30' (12:00 UTC) and not by '>= 14:00+01:30'."""
    from datetime import UTC, datetime

    from records.models import AdmissionDecision

    acme = make_tenant("acme")
    AdmissionDecision.objects.create(
        stream_id="1-0",
        occurred_at=datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
        request_id="r-1",
        decision=AdmissionDecision.Kind.REJECTED,
        tenant_id=acme.pk,
        tenant=acme.slug,
        use_case_id=make_use_case(acme, "chatbot").pk,
        model="m",
    )

    def found(bound: str) -> int:
        response = admin_client.get("/api/admission-decisions/", {"occurred_at__gte": bound})
        assert response.status_code == 200, response.content
        return int(response.json()["count"])

    assert found("2026-03-01T13:30:00+01:30") == 1
    assert found("2026-03-01T14:00:00+01:30") == 0
