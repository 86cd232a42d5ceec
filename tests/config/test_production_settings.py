"""Production settings: HSTS, a Content-Security-Policy the pages keep to, bounded sessions
whose roles come back from the IdP, a loud refusal of SQLite and DEBUG, and no plaintext
never-expiring API tokens."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any, cast

import pytest
from django.db import connection
from django.test import Client

from governance.roles import Role
from ops.processes import PYTHON, REPO_ROOT
from testkit.factories import make_user

PRODUCTION = {
    "SWITCHYARD_MODE": "production",
    "SWITCHYARD_SECRET_KEY": "s" * 50,
    "SWITCHYARD_AUDIT_ANCHOR_KEY": "a" * 50,
    "SWITCHYARD_ALLOWED_HOSTS": "switchyard.example.com",
    "SWITCHYARD_DATABASE_URL": "postgres://switchyard@db.example.com:5432/switchyard",
    # Production refuses to start without the keys that seal transcripts and sign exports.
    "SWITCHYARD_RECORDS_KEYS": "k1:" + "QUFB" * 10 + "QUE=",
    "SWITCHYARD_AUDIT_EXPORT_SIGNING_KEY": "QUFB" * 10 + "QUE=",
    "SWITCHYARD_JOB_KEY_SECRET": "job-key-secret-for-the-production-settings-test",
}
SSO = {
    "SWITCHYARD_OIDC_ISSUER": "https://kc.example.com/realms/switchyard",
    "SWITCHYARD_OIDC_CLIENT_ID": "switchyard-portal",
    "SWITCHYARD_OIDC_CLIENT_SECRET": "s3cret",
}
_SCRIPT = """
import json, runpy, sys
ns = runpy.run_path("config/settings.py")
names = sys.argv[1:]
json.dump({k: ns.get(k) for k in names}, sys.stdout, default=str)
"""


def settings_for(variables: dict[str, str], *names: str) -> dict[str, Any]:
    """What config/settings.py makes of these variables, in a fresh interpreter."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    result = subprocess.run(
        [PYTHON, "-c", _SCRIPT, *names],
        cwd=REPO_ROOT,
        env={**env, **variables},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr.strip().splitlines()[-1])
    values: dict[str, Any] = json.loads(result.stdout)
    return values


def test_production_refuses_sqlite() -> None:
    without_database = {k: v for k, v in PRODUCTION.items() if k != "SWITCHYARD_DATABASE_URL"}
    with pytest.raises(RuntimeError, match="SQLite") as refused:
        settings_for(without_database, "DATABASES")
    assert "SWITCHYARD_DATABASE_URL" in str(refused.value)


def test_production_refuses_debug() -> None:
    with pytest.raises(RuntimeError, match="DEBUG") as refused:
        settings_for({**PRODUCTION, "SWITCHYARD_DEBUG": "true"}, "DEBUG")
    assert "SWITCHYARD_DEBUG" in str(refused.value)


def test_production_sends_hsts() -> None:
    values = settings_for(
        PRODUCTION, "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "DEBUG"
    )
    assert values["SECURE_HSTS_SECONDS"] >= 31_536_000
    assert values["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is True
    assert values["DEBUG"] is False


def test_sessions_are_bounded_and_sso_roles_are_refreshed_from_the_idp() -> None:
    names = ("SESSION_COOKIE_AGE", "MIDDLEWARE", "OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS")
    values = settings_for({**PRODUCTION, **SSO}, *names)
    assert values["SESSION_COOKIE_AGE"] <= 12 * 3600
    # The ID token is renewed (prompt=none) this often; each renewal signs in again, which
    # re-reads the roles from the claims (portal/auth.py).
    assert "mozilla_django_oidc.middleware.SessionRefresh" in values["MIDDLEWARE"]
    assert values["OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS"] <= 900
    assert values["MIDDLEWARE"].index("mozilla_django_oidc.middleware.SessionRefresh") > values[
        "MIDDLEWARE"
    ].index("django.contrib.auth.middleware.AuthenticationMiddleware")
    without_sso = settings_for(PRODUCTION, *names)
    assert without_sso["SESSION_COOKIE_AGE"] <= 12 * 3600
    assert "mozilla_django_oidc.middleware.SessionRefresh" not in without_sso["MIDDLEWARE"]


INLINE = re.compile(
    r"<script(?![^>]*\bsrc=)[^>]*>|<style\b|\sstyle=\"|\son[a-z]+=\"", re.IGNORECASE
)


def test_no_template_needs_inline_script_or_style() -> None:
    """The policy allows neither; an inline one would be silently blocked in the browser."""
    templates = [*(REPO_ROOT / "templates").rglob("*.html")]
    templates += [*(REPO_ROOT / "portal" / "templates").rglob("*.html")]
    assert templates
    offending = {
        str(path.relative_to(REPO_ROOT)): INLINE.findall(path.read_text())
        for path in templates
        if INLINE.search(path.read_text())
    }
    assert offending == {}


def _policy(response: Any) -> dict[str, list[str]]:
    header = response.headers["Content-Security-Policy"]
    directives = (part.strip().split() for part in header.split(";") if part.strip())
    return {name: values for name, *values in directives}


@pytest.mark.django_db
def test_pages_carry_a_content_security_policy_without_inline_script() -> None:
    policy = _policy(Client().get("/accounts/login/"))
    assert policy["default-src"] == ["'self'"]
    assert policy["script-src"] == ["'self'"]
    assert policy["style-src"] == ["'self'"]
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["object-src"] == ["'none'"]


@pytest.mark.django_db
def test_the_swagger_ui_page_works_under_the_policy() -> None:
    client = Client()
    client.force_login(cast(Any, make_user("olivia", Role.OFFICER)))
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "inline script is blocked"
    policy = _policy(page)
    assert policy["script-src"] == ["'self'"]
    scripts = re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", html)
    assert scripts
    for src in scripts:
        assert src.startswith("/"), src  # same origin
        if "?" in src and src.split("?")[0] == "/api/docs/":
            loaded = client.get(src)
            assert loaded.status_code == 200
            assert "SwaggerUIBundle" in loaded.content.decode()


@pytest.mark.django_db
def test_drf_plaintext_tokens_are_gone() -> None:
    from django.conf import settings

    assert "rest_framework.authtoken" not in settings.INSTALLED_APPS
    assert "authtoken_token" not in connection.introspection.table_names()
    client = Client()
    make_user("ci-bot", Role.OFFICER)
    answer = client.get("/api/me/", HTTP_AUTHORIZATION="Token 0123456789abcdef")
    assert answer.status_code == 401
