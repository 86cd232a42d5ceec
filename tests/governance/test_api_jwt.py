"""Keycloak service-account JWTs on /api/, against a real OIDC provider process.

The provider issues client-credentials tokens the way Keycloak does (azp, preferred_username
"service-account-<client>", realm_access.roles, groups, an audience). Tokens it will not issue
(expired, another issuer) are signed here with the realm's own key, so that only the one claim
under test is wrong; the keys are always fetched from the provider's real JWKS endpoint.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.authentication import SessionAuthentication
from rest_framework.settings import api_settings

from governance.audit import Actor, audit_record
from governance.models import ApiKey, AuditEvent, GuardrailSelection, Model, RateLimitPolicy, Tenant
from governance.roles import Role, roles_of, roles_set
from testkit.factories import make_key, make_tenant, make_use_case
from testkit.oidc import (
    API_AUDIENCE,
    AUTOMATION_CLIENT,
    OTHER_RESOURCE,
    ROLELESS_CLIENT,
    ROLELESS_SECRET,
    Provider,
    settings_from_environment,
)

pytestmark = pytest.mark.django_db

SERVICE_ACCOUNT = f"service-account-{AUTOMATION_CLIENT}"


@pytest.fixture(scope="module")
def api_values(provider: Provider) -> dict[str, Any]:
    # Only the realm is configured: the API accepts its tokens without the portal's SSO.
    return settings_from_environment(SWITCHYARD_OIDC_ISSUER=provider.issuer)


@pytest.fixture
def realm(settings, provider: Provider, api_values: dict[str, Any]) -> Provider:
    # Only the realm's settings, as config/settings.py makes them from the environment; the
    # API's authentication classes are the real ones from REST_FRAMEWORK, unpatched.
    for name, value in api_values.items():
        if name.startswith(("OIDC_", "SSO_")):
            setattr(settings, name, value)
    make_tenant("acme")
    Model.objects.create(public_id="llama-3.1-8b-instruct", capabilities=["chat"])
    return provider


def get_models(token: str | None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return Client().get("/api/models/", headers=headers)


def claims(realm: Provider, **changes: Any) -> dict[str, Any]:
    """A service-account token's claims, as the realm issues them, with ``changes``."""
    now = int(time.time())
    return {
        "iss": realm.issuer,
        "aud": API_AUDIENCE,
        "sub": AUTOMATION_CLIENT,
        "azp": AUTOMATION_CLIENT,
        "client_id": AUTOMATION_CLIENT,
        "preferred_username": SERVICE_ACCOUNT,
        "realm_access": {"roles": ["developer"]},
        "iat": now,
        "exp": now + 300,
        **changes,
    }


def assert_refused(response: Any, reason: str) -> None:
    assert response.status_code == 401, response.content
    assert reason in response.json()["detail"]
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_client_credentials_token_from_the_realm_authenticates_the_api(realm: Provider) -> None:
    """GIVEN the automation client, a service account with role developer in /tenants/acme
    WHEN it calls /api/models/ with a client-credentials token from the realm
    THEN the call succeeds as user service-account-switchyard-automation with that access."""
    token = realm.client_credentials_token()
    response = get_models(token)
    assert response.status_code == 200, response.content
    assert [m["public_id"] for m in response.json()["results"]] == ["llama-3.1-8b-instruct"]

    account = get_user_model().objects.get(username=SERVICE_ACCOUNT)
    assert {str(r) for r in roles_of(account)} == {"developer"}
    assert list(Tenant.objects.filter(members=account).values_list("slug", flat=True)) == ["acme"]
    assert not account.has_usable_password()

    assert get_models(realm.client_credentials_token()).status_code == 200
    changes = AuditEvent.objects.filter(actor=SERVICE_ACCOUNT, action="user.roles_changed")
    assert changes.count() == 1  # the first call granted access; the second changed nothing


def test_a_tampered_signature_is_refused(realm: Provider) -> None:
    header, payload, signature = realm.client_credentials_token().split(".")
    flipped = ("A" if signature[0] != "A" else "B") + signature[1:]
    assert_refused(get_models(f"{header}.{payload}.{flipped}"), "signature does not verify")


def test_a_token_with_altered_claims_is_refused(realm: Provider) -> None:
    header, _, signature = realm.client_credentials_token().split(".")
    forged_payload = realm.sign(claims(realm, realm_access={"roles": ["admin"]})).split(".")[1]
    assert_refused(get_models(f"{header}.{forged_payload}.{signature}"), "signature")


def test_an_expired_token_is_refused(realm: Provider, settings) -> None:
    settings.SSO_API_LEEWAY_SECONDS = 5
    past = int(time.time()) - 600
    token = realm.sign(claims(realm, iat=past, exp=past + 300))
    assert_refused(get_models(token), "has expired")


def test_a_token_from_another_issuer_is_refused(realm: Provider) -> None:
    token = realm.sign(claims(realm, iss="http://127.0.0.1:1/realms/elsewhere"))
    assert_refused(get_models(token), f"not issued by {realm.issuer}")


def test_a_token_for_another_audience_is_refused(realm: Provider) -> None:
    """The realm itself issues it, for another resource server (RFC 8707 resource indicator)."""
    token = realm.client_credentials_token(resource=OTHER_RESOURCE)
    assert_refused(get_models(token), "not meant for this API")


def test_a_token_signed_by_an_unpublished_key_is_refused(realm: Provider) -> None:
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = realm.sign(claims(realm), key=stranger)
    assert_refused(get_models(token), "signature does not verify")


def test_a_persons_token_is_not_a_service_account_token(realm: Provider) -> None:
    token = realm.sign(claims(realm, preferred_username="alice", sub="a-person"))
    assert_refused(get_models(token), "Only service-account tokens")


def test_only_the_configured_clients_may_call(realm: Provider, settings) -> None:
    settings.SSO_API_CLIENTS = ["switchyard-reporting"]
    assert_refused(get_models(realm.client_credentials_token()), "may not use this API")


def test_a_service_account_without_a_role_is_forbidden(realm: Provider) -> None:
    token = realm.client_credentials_token(ROLELESS_CLIENT, ROLELESS_SECRET)
    response = get_models(token)
    assert response.status_code == 403
    assert "none of the Switchyard roles" in response.json()["detail"]


def test_other_credentials_are_left_to_the_other_authenticators(realm: Provider) -> None:
    """An API key is not a JWT: not judged here. No header at all: sessions work as before."""
    assert get_models("sk-sy-not-a-jwt").status_code in (401, 403)
    client = Client()
    assert client.get("/api/models/").status_code in (401, 403)
    officer = get_user_model().objects.create_user("olivia", password="pw-x-123456")
    roles_set(officer, [Role.OFFICER])
    client.force_login(officer)
    assert client.get("/api/models/").status_code == 200
    assert not get_user_model().objects.filter(username__startswith="service-account-").exists()


def test_the_class_is_wired_into_the_api_settings() -> None:
    """REST_FRAMEWORK lists the class (anywhere: its 401s carry their own challenge)."""
    classes: list[Any] = list(api_settings.DEFAULT_AUTHENTICATION_CLASSES)
    paths = [f"{c.__module__}.{c.__qualname__}" for c in classes]
    assert SessionAuthentication in classes
    assert "governance.api.authentication.ServiceAccountJWTAuthentication" in paths


# --- every route family of /api/, through the real REST_FRAMEWORK wiring ---------------------
@pytest.fixture
def acme_records(realm: Provider) -> dict[str, Any]:
    """One record of acme's in each family, so each list has something the account may see."""
    acme = Tenant.objects.get(slug="acme")
    llama = Model.objects.get()
    chatbot = make_use_case(acme, "chatbot", models=(llama,))
    key, _ = make_key(chatbot)
    guardrail = GuardrailSelection.objects.create(
        use_case=chatbot, guardrail="pii", side="request", action="redact"
    )
    limit = RateLimitPolicy.objects.create(
        name="acme-cap", scope="tenant", tenant=acme, requests_per_minute=600
    )
    event = audit_record(
        actor=Actor.system("tests"), action="tenant.update", obj=acme, tenant_slug="acme"
    )
    return {
        "/api/tenants/": ("slug", "acme"),
        "/api/models/": ("public_id", llama.public_id),
        "/api/use-cases/": ("id", chatbot.pk),
        "/api/guardrail-selections/": ("id", guardrail.pk),
        "/api/priority-classes/": ("name", None),
        "/api/priority-rules/": ("id", None),
        "/api/rate-limit-policies/": ("id", limit.pk),
        "/api/api-keys/": ("id", key.pk),
        "/api/audit-events/": ("sequence", event.sequence),
        "/api/admission-decisions/": ("id", None),
    }


LIST_ROUTES = [
    "/api/tenants/",
    "/api/models/",
    "/api/use-cases/",
    "/api/guardrail-selections/",
    "/api/priority-classes/",
    "/api/priority-rules/",
    "/api/rate-limit-policies/",
    "/api/api-keys/",
    "/api/audit-events/",
    "/api/admission-decisions/",
]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("url", LIST_ROUTES)
def test_a_realm_token_reads_every_route_family_as_its_service_account(
    realm: Provider, acme_records: dict[str, Any], url: str
) -> None:
    """GIVEN the automation client (developer of acme) WHEN it lists a family with its token
    THEN it is served as that account, with acme's record in the list."""
    response = Client().get(url, headers=bearer(realm.client_credentials_token()))
    assert response.status_code == 200, response.content
    field, expected = acme_records[url]
    if expected is not None:
        assert expected in [item[field] for item in response.json()["results"]]


@pytest.mark.parametrize("url", [*LIST_ROUTES, "/api/deployments/", "/api/me/"])
def test_a_tampered_token_is_refused_on_every_route_family(realm: Provider, url: str) -> None:
    """The JWT authenticator judges the token on every route, not only where it was tried."""
    header, payload, signature = realm.client_credentials_token().split(".")
    flipped = ("A" if signature[0] != "A" else "B") + signature[1:]
    assert_refused(Client().get(url, headers=bearer(f"{header}.{payload}.{flipped}")), "signature")


def test_a_realm_token_on_the_officers_routes_is_forbidden_not_unauthenticated(
    realm: Provider,
) -> None:
    """Signed in as a developer: the fleet's deployments are refused for the role (403)."""
    response = Client().get("/api/deployments/", headers=bearer(realm.client_credentials_token()))
    assert response.status_code == 403, response.content
    assert "officers and admins" in response.json()["detail"]


def test_me_answers_who_the_token_is(realm: Provider) -> None:
    response = Client().get("/api/me/", headers=bearer(realm.client_credentials_token()))
    assert response.status_code == 200, response.content
    assert response.json() == {
        "username": SERVICE_ACCOUNT,
        "roles": ["developer"],
        "tenants": ["acme"],
    }


def test_a_realm_token_writes_through_the_api_as_its_service_account(
    realm: Provider, acme_records: dict[str, Any]
) -> None:
    """A key request made with the token is the service account's, audited under its name."""
    _, chatbot_id = acme_records["/api/use-cases/"]
    response = Client().post(
        "/api/api-keys/",
        {"use_case": chatbot_id, "name": "nightly", "reason": "the nightly batch"},
        content_type="application/json",
        headers=bearer(realm.client_credentials_token()),
    )
    assert response.status_code == 201, response.content
    key = ApiKey.objects.get(pk=response.json()["id"])
    assert key.requested_by is not None
    assert key.requested_by.get_username() == SERVICE_ACCOUNT
    assert AuditEvent.objects.filter(actor=SERVICE_ACCOUNT, action="apikey.request").exists()
