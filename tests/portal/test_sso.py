"""Single sign-on, end to end: a real OIDC provider process, a real Django server, real sockets.

The provider (testkit/oidc/provider.js) is laid out like a Keycloak realm and the portal
is configured from SWITCHYARD_OIDC_* variables exactly as in production. Personas: alice a
developer of acme, olivia an officer, audrey an auditor, root an admin, bob a developer of
globex, mallory with no Switchyard role.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.test import Client

from governance.identity import claim_values, roles_from_claims, tenant_slugs_from_claims
from governance.models import AuditEvent, Tenant
from governance.roles import Role, roles_of
from testkit.factories import make_tenant
from testkit.oidc import (
    PORTAL_CLIENT,
    PORTAL_SECRET,
    Browser,
    Provider,
    SettingsRefused,
    settings_from_environment,
    start_provider,
)

live = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def provider(live_server, tmp_path_factory) -> Iterator[Provider]:
    started = start_provider(tmp_path_factory.mktemp("oidc"), redirect_base=live_server.url)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def sso_environment(provider: Provider) -> dict[str, str]:
    return {
        "SWITCHYARD_OIDC_ISSUER": provider.issuer,
        "SWITCHYARD_OIDC_CLIENT_ID": PORTAL_CLIENT,
        "SWITCHYARD_OIDC_CLIENT_SECRET": PORTAL_SECRET,
    }


@pytest.fixture(scope="module")
def sso_values(sso_environment: dict[str, str]) -> dict[str, Any]:
    return settings_from_environment(**sso_environment)


def apply(settings: Any, values: dict[str, Any]) -> None:
    for name, value in values.items():
        if name != "LOCAL_LOGIN_ENABLED":
            setattr(settings, name, value)


@pytest.fixture
def sso(settings, provider: Provider, sso_values: dict[str, Any]) -> Provider:
    """The portal configured for the provider, the personas as in the module docstring."""
    apply(settings, sso_values)
    provider.reset_accounts()
    make_tenant("acme")
    make_tenant("globex")
    return provider


@pytest.fixture
def browser() -> Iterator[Browser]:
    b = Browser()
    try:
        yield b
    finally:
        b.close()


def signed_in_as(browser: Browser, username: str) -> bool:
    """The browser's portal session (its cookie, looked up in the database) is ``username``'s."""
    return signed_in_user(browser) == username


def signed_in_user(browser: Browser) -> str | None:
    key = next((c.value for c in browser.http.cookies.jar if c.name == "sessionid"), None)
    user_id = SessionStore(session_key=key).get("_auth_user_id") if key else None
    user = get_user_model().objects.filter(pk=user_id).first() if user_id else None
    return user.get_username() if user is not None else None


def access(username: str) -> tuple[set[str], set[str]]:
    user = get_user_model().objects.get(username=username)
    tenants = set(Tenant.objects.filter(members=user).values_list("slug", flat=True))
    return {str(role) for role in roles_of(user)}, tenants


def audit_actions(username: str) -> list[str]:
    return list(
        AuditEvent.objects.filter(actor=username)
        .order_by("sequence")
        .values_list("action", flat=True)
    )


# --- end to end ------------------------------------------------------------------------------
@live
def test_alice_signs_in_with_sso_and_gets_her_role_and_tenant(sso, live_server, browser) -> None:
    """GIVEN alice, a developer in group /tenants/acme (and /tenants/nowhere, unknown here)
    WHEN she signs in through the provider's own login form
    THEN she lands signed in, as a developer of acme only, with her profile from the claims."""
    sso.set_account("alice", groups=["/tenants/acme", "/tenants/nowhere"])
    page = browser.sso_login(live_server.url, "alice", "alice-pw", next_url="/")
    assert page.status_code == 200
    assert str(page.url) == f"{live_server.url}/"
    assert signed_in_as(browser, "alice")
    assert access("alice") == ({"developer"}, {"acme"})
    alice = get_user_model().objects.get(username="alice")
    assert (alice.email, alice.first_name, alice.last_name) == (
        "alice@example.test",
        "Alice",
        "Anders",
    )
    assert not alice.has_usable_password()
    assert not alice.is_staff
    assert audit_actions("alice") == ["user.roles_changed", "user.login_sso"]
    change = AuditEvent.objects.get(actor="alice", action="user.roles_changed")
    assert change.before == {"roles": [], "tenants": []}
    assert change.after == {"roles": ["developer"], "tenants": ["acme"]}


@live
def test_roles_removed_at_the_idp_are_removed_at_the_next_login(sso, live_server) -> None:
    """GIVEN alice signed in once as developer and auditor of acme
    WHEN the IdP takes auditor away and moves her from acme to globex, and she signs in again
    THEN she is a developer of globex only, and the audit trail shows the change."""
    sso.set_realm_roles("alice", ["developer", "auditor"])
    first = Browser()
    first.sso_login(live_server.url, "alice", "alice-pw")
    assert signed_in_as(first, "alice")
    first.close()
    assert access("alice") == ({"developer", "auditor"}, {"acme"})

    sso.set_realm_roles("alice", ["developer"])
    sso.set_account("alice", groups=["/tenants/globex"])
    second = Browser()
    second.sso_login(live_server.url, "alice", "alice-pw")
    assert signed_in_as(second, "alice")
    second.close()

    assert access("alice") == ({"developer"}, {"globex"})
    change = AuditEvent.objects.filter(actor="alice", action="user.roles_changed").last()
    assert change is not None
    assert change.before == {"roles": ["auditor", "developer"], "tenants": ["acme"]}
    assert change.after == {"roles": ["developer"], "tenants": ["globex"]}
    assert audit_actions("alice").count("user.login_sso") == 2


@live
@pytest.mark.parametrize(
    ("username", "password", "role"),
    [("olivia", "olivia-pw", "officer"), ("audrey", "audrey-pw", "auditor")],
)
def test_officers_and_auditors_get_their_role(sso, live_server, browser, username, password, role):
    page = browser.sso_login(live_server.url, username, password)
    assert page.status_code == 200
    assert signed_in_as(browser, username)
    assert access(username) == ({role}, set())


@live
def test_the_admin_role_is_django_superuser_until_the_idp_takes_it_away(sso, live_server) -> None:
    first = Browser()
    first.sso_login(live_server.url, "root", "root-pw")
    first.close()
    root = get_user_model().objects.get(username="root")
    assert (root.is_superuser, root.is_staff) == (True, True)

    sso.set_realm_roles("root", ["officer"])
    second = Browser()
    second.sso_login(live_server.url, "root", "root-pw")
    second.close()
    root.refresh_from_db()
    assert (root.is_superuser, root.is_staff) == (False, False)
    assert access("root") == ({"officer"}, set())


@live
def test_roles_can_come_from_groups_with_a_name_mapping(sso, live_server, browser, settings):
    """Role claim `groups` and SWITCHYARD_OIDC_ROLE_MAP=/switchyard/officers=officer."""
    settings.SSO_ROLE_CLAIM = "groups"
    settings.SSO_ROLE_MAP = {"/switchyard/officers": "officer"}
    sso.set_realm_roles("olivia", [])  # her realm roles no longer matter
    browser.sso_login(live_server.url, "olivia", "olivia-pw")
    assert signed_in_as(browser, "olivia")
    assert access("olivia") == ({"officer"}, set())


@live
def test_a_user_with_no_switchyard_role_is_refused(sso, live_server, browser) -> None:
    """GIVEN mallory, who has only Keycloak's default roles
    WHEN she signs in at the provider
    THEN the portal's sign-in page says why she is refused, and she is not signed in."""
    page = browser.sso_login(live_server.url, "mallory", "mallory-pw")
    assert page.status_code == 403
    assert "has none of the Switchyard roles" in page.text
    assert "Sign in with SSO" in page.text
    assert signed_in_user(browser) is None
    assert not get_user_model().objects.filter(username="mallory").exists()
    refusal = AuditEvent.objects.get(action="user.login_sso_refused")
    assert (refusal.actor, refusal.after) == ("mallory", {"reason": "no Switchyard role"})


@live
def test_a_user_whose_last_role_is_removed_is_refused_and_keeps_nothing(sso, live_server) -> None:
    first = Browser()
    first.sso_login(live_server.url, "alice", "alice-pw")
    first.close()
    sso.set_realm_roles("alice", [])
    second = Browser()
    page = second.sso_login(live_server.url, "alice", "alice-pw")
    second.close()
    assert page.status_code == 403
    assert "has none of the Switchyard roles" in page.text
    assert access("alice") == (set(), set())
    assert audit_actions("alice")[-2:] == ["user.roles_changed", "user.login_sso_refused"]


@live
def test_an_sso_identity_never_takes_over_a_local_account(sso, live_server, browser) -> None:
    get_user_model().objects.create_user("bob", password="local-password-123")
    page = browser.sso_login(live_server.url, "bob", "bob-pw")
    assert page.status_code == 403
    assert "A local account named" in page.text
    assert access("bob") == (set(), set())


@live
def test_logout_ends_the_provider_session_too(sso, live_server, browser) -> None:
    """GIVEN alice signed in (and the provider remembers her: a second SSO round needs no password)
    WHEN she signs out of the portal
    THEN the portal sends her to the provider's end-session endpoint with her ID token, and the
    next sign-in asks for her credentials again."""
    portal = live_server.url
    browser.sso_login(portal, "alice", "alice-pw")
    assert signed_in_as(browser, "alice")
    again = browser.get(f"{portal}/oidc/authenticate/")
    assert not Browser.is_provider_login(again)
    assert signed_in_as(browser, "alice")

    token = browser.csrf_token(portal)
    confirm = browser.http.post(f"{portal}/oidc/logout/", data={"csrfmiddlewaretoken": token})
    to_provider = urlsplit(confirm.history[0].headers["location"])
    assert f"{to_provider.scheme}://{to_provider.netloc}{to_provider.path}" == (
        f"{sso.issuer}/protocol/openid-connect/logout"
    )
    query = parse_qs(to_provider.query)
    assert query["post_logout_redirect_uri"] == [f"{portal}/"]
    assert query["id_token_hint"][0].count(".") == 2
    assert confirm.status_code == 200, confirm.text
    done = browser.submit(confirm, "op.logoutForm", logout="yes")
    assert str(done.url) == f"{portal}/"
    assert signed_in_user(browser) is None

    prompt = browser.get(f"{portal}/oidc/authenticate/")
    assert Browser.is_provider_login(prompt)
    assert "user.logout_sso" in audit_actions("alice")


@live
def test_a_callback_the_portal_did_not_start_is_refused(sso, live_server, browser) -> None:
    forged = browser.get(f"{live_server.url}/oidc/callback/", code="stolen", state="guessed")
    assert forged.status_code == 403
    assert "Sign-in with single sign-on failed" in forged.text
    error = browser.get(
        f"{live_server.url}/oidc/callback/",
        error="access_denied",
        error_description="<b>Call 555-0100 to verify</b>",
    )
    assert error.status_code == 403
    assert "(access_denied)" in error.text
    assert "555-0100" not in error.text  # free text from the URL is never shown


@live
def test_with_local_login_off_only_sso_signs_anyone_in(
    settings, sso, sso_environment, live_server, browser
) -> None:
    """SWITCHYARD_LOCAL_LOGIN=false (production's default): no password form, not even admin's."""
    values = settings_from_environment(**sso_environment, SWITCHYARD_LOCAL_LOGIN="false")
    assert values["AUTHENTICATION_BACKENDS"] == ["portal.auth.SwitchyardOIDCBackend"]
    assert values["LOGIN_URL"] == "/oidc/authenticate/"
    apply(settings, values)
    settings.LOCAL_LOGIN_ENABLED = False
    get_user_model().objects.create_superuser("root", "root@example.invalid", "pw-x-123456")
    portal = live_server.url

    assert browser.get(f"{portal}/accounts/login/").status_code == 404
    admin_login = browser.get(f"{portal}/admin/login/")
    attempt = browser.submit(
        admin_login, "login-form", username="root", password="pw-x-123456", next="/admin/"
    )
    assert "/admin/login/" in str(attempt.url)
    assert signed_in_user(browser) is None

    browser.sso_login(portal, "alice", "alice-pw")
    assert signed_in_as(browser, "alice")


# --- configuration ----------------------------------------------------------------------------
def test_endpoints_follow_keycloaks_layout_and_each_can_be_overridden(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    realm = "https://kc.example.com/realms/switchyard"
    values = settings_from_environment(
        SWITCHYARD_OIDC_ISSUER=realm + "/",
        SWITCHYARD_OIDC_CLIENT_ID="switchyard-portal",
        SWITCHYARD_OIDC_CLIENT_SECRET_FILE=str(secret),
        SWITCHYARD_OIDC_USERINFO_ENDPOINT="https://elsewhere.example.com/me",
        SWITCHYARD_OIDC_ROLE_MAP="sy-officer=officer, sy-dev=developer",
    )
    assert values["SSO_ENABLED"] is True
    assert values["SSO_ISSUER"] == realm
    assert values["OIDC_RP_CLIENT_SECRET"] == "from-a-file"
    assert values["OIDC_OP_AUTHORIZATION_ENDPOINT"] == f"{realm}/protocol/openid-connect/auth"
    assert values["OIDC_OP_TOKEN_ENDPOINT"] == f"{realm}/protocol/openid-connect/token"
    assert values["OIDC_OP_JWKS_ENDPOINT"] == f"{realm}/protocol/openid-connect/certs"
    assert values["SSO_END_SESSION_ENDPOINT"] == f"{realm}/protocol/openid-connect/logout"
    assert values["OIDC_OP_USER_ENDPOINT"] == "https://elsewhere.example.com/me"
    assert values["OIDC_RP_SIGN_ALGO"] == "RS256"
    assert values["OIDC_STORE_ID_TOKEN"] is True
    assert values["SSO_ROLE_MAP"] == {"sy-officer": "officer", "sy-dev": "developer"}
    assert values["AUTHENTICATION_BACKENDS"][0] == "portal.auth.SwitchyardOIDCBackend"


def test_sso_is_off_without_a_client_id_and_the_defaults_are_keycloaks() -> None:
    values = settings_from_environment()
    assert values["SSO_ENABLED"] is False
    assert values["SSO_API_ENABLED"] is False
    assert values["AUTHENTICATION_BACKENDS"] == ["django.contrib.auth.backends.ModelBackend"]
    assert values["SSO_ROLE_CLAIM"] == "realm_access.roles"
    assert values["SSO_ROLE_MAP"] == {r: r for r in ("officer", "developer", "auditor", "admin")}
    assert values["SSO_TENANT_GROUP_PREFIX"] == "/tenants/"


def test_production_signs_in_with_sso_only() -> None:
    values = settings_from_environment(
        SWITCHYARD_MODE="production",
        SWITCHYARD_SECRET_KEY="s" * 50,
        SWITCHYARD_AUDIT_ANCHOR_KEY="a" * 50,
        # Production requires the keys that seal transcripts and sign audit exports.
        SWITCHYARD_RECORDS_KEYS="k1:" + "QUFB" * 10 + "QUE=",
        SWITCHYARD_AUDIT_EXPORT_SIGNING_KEY="QUFB" * 10 + "QUE=",
        SWITCHYARD_JOB_KEY_SECRET="job-key-secret-for-the-sso-test",
        SWITCHYARD_DATABASE_URL="postgres://switchyard@db.example.com:5432/switchyard",
        SWITCHYARD_ALLOWED_HOSTS="switchyard.example.com",
        SWITCHYARD_OIDC_ISSUER="https://kc.example.com/realms/switchyard",
        SWITCHYARD_OIDC_CLIENT_ID="switchyard-portal",
        SWITCHYARD_OIDC_CLIENT_SECRET="s3cret",
    )
    assert values["LOCAL_LOGIN_ENABLED"] is False
    assert values["AUTHENTICATION_BACKENDS"] == ["portal.auth.SwitchyardOIDCBackend"]
    assert values["LOGIN_URL"] == "/oidc/authenticate/"


@pytest.mark.parametrize(
    ("variables", "complaint"),
    [
        (
            {"SWITCHYARD_OIDC_CLIENT_ID": "x", "SWITCHYARD_OIDC_CLIENT_SECRET": "y"},
            "SWITCHYARD_OIDC_ISSUER",
        ),
        (
            {"SWITCHYARD_OIDC_CLIENT_ID": "x", "SWITCHYARD_OIDC_ISSUER": "https://kc"},
            "SWITCHYARD_OIDC_CLIENT_SECRET",
        ),
        ({"SWITCHYARD_OIDC_ROLE_MAP": "sy-boss=overlord"}, "SWITCHYARD_OIDC_ROLE_MAP"),
    ],
)
def test_a_bad_sso_configuration_stops_the_start(variables: dict[str, str], complaint: str) -> None:
    with pytest.raises(SettingsRefused, match=complaint):
        settings_from_environment(**variables)


@pytest.mark.django_db
def test_the_sign_in_page_offers_sso_only_when_it_is_configured(client: Client, settings) -> None:
    settings.SSO_ENABLED = False
    page = client.get("/accounts/login/")
    assert "Sign in with SSO" not in page.content.decode()
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/").status_code == 404

    settings.SSO_ENABLED = True
    html = client.get("/accounts/login/?next=/api/").content.decode()
    assert 'href="/oidc/authenticate/?next=/api/"' in html
    assert "Sign in with SSO" in html


# --- claims → roles and tenants ---------------------------------------------------------------
KEYCLOAK_CLAIMS = {
    "realm_access": {"roles": ["offline_access", "developer", "sy-officer"]},
    "resource_access": {"switchyard-portal": {"roles": ["auditor"]}, "account": {"roles": ["x"]}},
    "groups": [
        "/tenants/acme",
        "/tenants/globex/ops",
        "/tenants/",
        "/other/acme",
        "tenant:initech",
    ],
}
IDENTITY = {str(r): str(r) for r in Role}


def test_claim_paths_reach_realm_roles_client_roles_and_groups() -> None:
    assert claim_values(KEYCLOAK_CLAIMS, "realm_access.roles")[1] == "developer"
    assert claim_values(KEYCLOAK_CLAIMS, "resource_access.switchyard-portal.roles") == ["auditor"]
    assert claim_values(KEYCLOAK_CLAIMS, "resource_access.nothing.roles") == []
    assert claim_values({"groups": "/single"}, "groups") == ["/single"]
    assert claim_values({"groups": {"not": "a list"}}, "groups") == []


def test_roles_come_from_the_configured_claim_through_the_name_map() -> None:
    assert roles_from_claims(KEYCLOAK_CLAIMS, claim="realm_access.roles", role_map=IDENTITY) == {
        Role.DEVELOPER
    }
    mapped = roles_from_claims(
        KEYCLOAK_CLAIMS, claim="realm_access.roles", role_map={"sy-officer": "officer"}
    )
    assert mapped == {Role.OFFICER}
    client_roles = roles_from_claims(
        KEYCLOAK_CLAIMS, claim="resource_access.switchyard-portal.roles", role_map=IDENTITY
    )
    assert client_roles == {Role.AUDITOR}


def test_tenants_come_from_groups_under_the_prefix() -> None:
    slugs = tenant_slugs_from_claims(KEYCLOAK_CLAIMS, claim="groups", prefix="/tenants/")
    assert slugs == {"acme", "globex"}
    assert tenant_slugs_from_claims(KEYCLOAK_CLAIMS, claim="groups", prefix="tenant:") == {
        "initech"
    }
    assert tenant_slugs_from_claims(KEYCLOAK_CLAIMS, claim="groups", prefix="") == set()
