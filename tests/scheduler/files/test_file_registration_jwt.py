"""A Keycloak service account registers files as the rest of /api/ is used: with a
client-credentials token from a real OIDC provider process, as a developer of its tenant."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from governance.models import AuditEvent, FileRegistration, Model, Tenant
from testkit.factories import make_tenant, make_use_case
from testkit.oidc import Provider, settings_from_environment

pytestmark = pytest.mark.django_db


@pytest.fixture
def realm(live_valkey_settings: Any, provider: Provider) -> Provider:
    for name, value in settings_from_environment(SWITCHYARD_OIDC_ISSUER=provider.issuer).items():
        if name.startswith(("OIDC_", "SSO_")):
            setattr(live_valkey_settings, name, value)
    make_tenant("acme")
    make_tenant("globex")
    return provider


def register(token: str, use_case: int) -> Any:
    body = {
        "use_case": use_case,
        "kind": "text",
        "filename": "contract.txt",
        "model": "llama",
        "declared_bytes": 40_000,
        "deadline": (timezone.now() + timedelta(hours=1)).isoformat(),
    }
    return Client().post(
        "/api/files/",
        body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


def test_a_service_account_registers_for_its_tenant_and_not_for_others(realm: Provider) -> None:
    """GIVEN the automation client, developer of acme WHEN it registers a text file for an
    acme use case THEN it is promised (10 000 tokens, bytes / 4) and audited under its name;
    a use case of globex does not exist for it."""
    llama = Model.objects.create(public_id="llama", capabilities=["chat"])
    acme_docs = make_use_case(Tenant.objects.get(slug="acme"), "docs", models=(llama,))
    globex_docs = make_use_case(Tenant.objects.get(slug="globex"), "docs", models=(llama,))
    token = realm.client_credentials_token()

    response = register(token, acme_docs.pk)
    assert response.status_code == 201, response.content
    assert response.json()["estimated_tokens"] == 10_000
    account = response.json()["registered_by"]
    assert account.startswith("service-account-")
    assert FileRegistration.objects.get().registered_by == account
    assert AuditEvent.objects.get(action="file.register").actor == account

    assert register(token, globex_docs.pk).status_code == 404
