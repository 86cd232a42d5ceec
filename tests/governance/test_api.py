"""The governance API's flows, error shapes, auth methods and schema."""

from __future__ import annotations

import logging

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from governance.keys import key_hash
from governance.models import ApiKey
from governance.roles import Role
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    acme = make_tenant("acme")
    llama = make_model("llama")
    use_case = make_use_case(acme, "chatbot", models=(llama,))
    clients = {}
    for name, role in (("alice", Role.DEVELOPER), ("olivia", Role.OFFICER)):
        client = APIClient()
        client.force_authenticate(make_user(name, role, tenants=(acme,)))
        clients[name] = client
    return {**clients, "use_case": use_case}


def test_a_key_from_request_to_revocation_through_the_api(people, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    alice, olivia = people["alice"], people["olivia"]
    requested = alice.post(
        "/api/api-keys/",
        {"use_case": people["use_case"].pk, "name": "ci", "reason": "CI"},
        format="json",
    )
    assert requested.status_code == 201, requested.data
    key_id = requested.data["id"]
    assert requested.data["status"] == "pending"
    assert (
        olivia.post(f"/api/api-keys/{key_id}/approve/", {}, format="json").data["status"]
        == "approved"
    )

    revealed = alice.post(f"/api/api-keys/{key_id}/reveal/")
    assert revealed.status_code == 200
    assert revealed["Cache-Control"] == "no-store"
    secret = revealed.data["secret"]
    assert secret.startswith("sk-sy-")
    assert revealed.data["key"]["prefix"] == secret[:12]
    again = alice.post(f"/api/api-keys/{key_id}/reveal/")
    assert again.status_code == 409
    assert "already revealed" in again.data["detail"]

    rotated = alice.post(f"/api/api-keys/{key_id}/rotate/", {"grace_seconds": 600}, format="json")
    assert rotated.status_code == 200
    new_secret = rotated.data["secret"]
    assert new_secret != secret
    assert (
        alice.post(f"/api/api-keys/{key_id}/revoke/", {"reason": "done"}, format="json").data[
            "status"
        ]
        == "revoked"
    )

    # No listing, detail or log line ever shows a secret or its hash.
    listing = (
        alice.get("/api/api-keys/").content.decode()
        + alice.get(f"/api/api-keys/{key_id}/").content.decode()
    )
    for value in (secret, new_secret, key_hash(secret), key_hash(new_secret)):
        assert value not in listing
        assert value not in caplog.text
    assert ApiKey.objects.filter(status="active").count() == 1  # the rotated successor


def test_bad_values_get_a_400_naming_each_field(people) -> None:
    response = people["olivia"].post(
        "/api/tenants/",
        {
            "slug": "Bad Slug",
            "name": "x",
            "business_unit": "x",
            "application_id": "nope",
            "environment": "mars",
            "owner_email": "nope",
        },
        format="json",
    )
    assert response.status_code == 400
    assert {"slug", "application_id", "environment", "owner_email"} <= set(response.data)
    # Rules checked by the model's clean() arrive in the same shape.
    bad_model = people["olivia"].post(
        "/api/models/", {"public_id": "x", "capabilities": ["telepathy"]}, format="json"
    )
    assert bad_model.status_code == 400
    assert "telepathy" in str(bad_model.data["capabilities"])


def test_a_state_conflict_is_409(people) -> None:
    use_case = people["use_case"]
    response = people["olivia"].post(f"/api/use-cases/{use_case.pk}/approve/", {}, format="json")
    assert response.status_code == 409
    assert "approved" in response.data["detail"]


def test_lists_filter_search_and_paginate(people) -> None:
    olivia = people["olivia"]
    acme = people["use_case"].tenant
    for i in range(55):
        make_use_case(acme, f"uc-{i:02d}", status="draft")
    page = olivia.get("/api/use-cases/", {"status": "draft"}).json()
    assert page["count"] == 55
    assert len(page["results"]) == 50
    assert page["next"]
    assert olivia.get("/api/use-cases/", {"search": "uc-07"}).json()["count"] == 1


def test_a_drf_token_is_not_a_way_in(people) -> None:
    # DRF's plaintext, never-expiring tokens are gone: automation uses Keycloak
    # service-account JWTs (tests/governance/test_api_jwt.py).
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token 0123456789abcdef0123456789abcdef01234567")
    assert client.get("/api/me/").status_code == 401


def test_the_openapi_schema_is_served_and_lints_clean(people, tmp_path) -> None:
    schema = people["alice"].get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    document = schema.json()
    assert document["openapi"].startswith("3.")
    assert "/api/api-keys/{id}/reveal/" in document["paths"]
    # drf-spectacular's own validator, failing on any warning.
    call_command(
        "spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml")
    )
    assert people["alice"].get("/api/docs/").status_code == 200
