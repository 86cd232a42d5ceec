"""The test OpenID Connect provider (provider.js, npm oidc-provider) and a browser-like client.

``start_provider`` runs the Node provider as a real process on an ephemeral loopback port, laid
out like a Keycloak realm, with the personas below; ``Browser`` follows redirects and fills in
the provider's login and sign-out forms the way a person would.

Personas (realm roles and groups as Keycloak would send them):
alice a developer of tenant acme, olivia a governance officer, audrey an auditor, root an
admin, bob a developer of globex (and a local account of the same name in some tests), mallory
an account with only Keycloak's default roles, none of Switchyard's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from ops.processes import PYTHON, REPO_ROOT, ManagedProcess, free_port, http_ready

HERE = Path(__file__).resolve().parent
REALM = "switchyard"
PORTAL_CLIENT = "switchyard-portal"
PORTAL_SECRET = "portal-secret-for-tests"
AUTOMATION_CLIENT = "switchyard-automation"
AUTOMATION_SECRET = "automation-secret-for-tests"
ROLELESS_CLIENT = "switchyard-roleless"
ROLELESS_SECRET = "roleless-secret-for-tests"
API_RESOURCE = "https://switchyard.test/api"
API_AUDIENCE = "switchyard-api"
OTHER_RESOURCE = "https://reports.test/api"
OTHER_AUDIENCE = "reports-api"
KEYCLOAK_DEFAULT_ROLES = ["offline_access", "uma_authorization", "default-roles-switchyard"]


def persona(
    given: str, family: str, password: str, roles: list[str], groups: list[str] | None = None
) -> dict[str, Any]:
    return {
        "password": password,
        "email": f"{given.lower()}@example.test",
        "given_name": given,
        "family_name": family,
        "realm_access": {"roles": [*KEYCLOAK_DEFAULT_ROLES, *roles]},
        "groups": groups or [],
    }


def default_personas() -> dict[str, dict[str, Any]]:
    return {
        "alice": persona("Alice", "Anders", "alice-pw", ["developer"], ["/tenants/acme"]),
        "olivia": persona("Olivia", "Officer", "olivia-pw", ["officer"], ["/switchyard/officers"]),
        "audrey": persona("Audrey", "Auditor", "audrey-pw", ["auditor"]),
        "root": persona("Root", "Admin", "root-pw", ["admin"]),
        "bob": persona("Bob", "Builder", "bob-pw", ["developer"], ["/tenants/globex"]),
        "mallory": persona("Mallory", "Malicious", "mallory-pw", []),
    }


def ensure_node_modules() -> None:
    """npm ci from the committed lock file, once, when node_modules is missing."""
    if (HERE / "node_modules" / "oidc-provider").is_dir():
        return
    npm = shutil.which("npm")
    assert npm, "npm is needed for the test OIDC provider (Node 20+)"
    subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"],
        cwd=HERE,
        check=True,
        capture_output=True,
        timeout=300,
    )


@dataclass
class Provider:
    process: ManagedProcess
    port: int
    config_path: Path
    config: dict[str, Any]
    private_key: rsa.RSAPrivateKey
    kid: str

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}/realms/{REALM}"

    @property
    def token_endpoint(self) -> str:
        return f"{self.issuer}/protocol/openid-connect/token"

    def set_account(self, username: str, **changes: Any) -> None:
        """Change a persona at the IdP; the provider reads accounts afresh at each login."""
        self.config["accounts"][username] = {**self.config["accounts"][username], **changes}
        self._write()

    def reset_accounts(self) -> None:
        self.config["accounts"] = default_personas()
        self._write()

    def set_realm_roles(self, username: str, roles: list[str]) -> None:
        self.set_account(username, realm_access={"roles": [*KEYCLOAK_DEFAULT_ROLES, *roles]})

    def _write(self) -> None:
        # Atomic, so the provider never reads half a file.
        scratch = self.config_path.with_suffix(".tmp")
        scratch.write_text(json.dumps(self.config))
        scratch.replace(self.config_path)

    def client_credentials_token(
        self, client_id: str = AUTOMATION_CLIENT, secret: str = AUTOMATION_SECRET, **extra: str
    ) -> str:
        response = httpx.post(
            self.token_endpoint,
            data={"grant_type": "client_credentials", **extra},
            auth=(client_id, secret),
            timeout=10,
        )
        assert response.status_code == 200, response.text
        token: str = response.json()["access_token"]
        return token

    def sign(self, claims: dict[str, Any], *, key: rsa.RSAPrivateKey | None = None) -> str:
        """A token signed with the realm's own key (or another), for claims the IdP won't issue."""
        return jwt.encode(
            claims,
            key or self.private_key,
            algorithm="RS256",
            headers={"kid": self.kid, "typ": "at+jwt"},
        )

    def stop(self) -> None:
        self.process.stop()


def start_provider(workdir: Path, *, redirect_base: str = "http://127.0.0.1:9") -> Provider:
    """Start provider.js with the personas; the portal client redirects to ``redirect_base``."""
    ensure_node_modules()
    private_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    kid = f"test-{int(time.time())}"
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private_key))
    jwk.pop("key_ops", None)  # ["sign"] would keep the provider from verifying its own tokens
    base = redirect_base.rstrip("/")
    config: dict[str, Any] = {
        "realm": REALM,
        "jwks": {"keys": [{**jwk, "kid": kid, "alg": "RS256", "use": "sig"}]},
        "clients": [
            {
                "client_id": PORTAL_CLIENT,
                "client_secret": PORTAL_SECRET,
                "redirect_uris": [f"{base}/oidc/callback/"],
                "post_logout_redirect_uris": [f"{base}/"],
                "grant_types": ["authorization_code"],
                "response_types": ["code"],
                "token_endpoint_auth_method": "client_secret_post",
            },
            {
                "client_id": AUTOMATION_CLIENT,
                "client_secret": AUTOMATION_SECRET,
                "grant_types": ["client_credentials"],
                "response_types": [],
                "redirect_uris": [],
                "service_account": {
                    "realm_access": {"roles": [*KEYCLOAK_DEFAULT_ROLES, "developer"]},
                    "groups": ["/tenants/acme"],
                },
            },
            {
                "client_id": ROLELESS_CLIENT,
                "client_secret": ROLELESS_SECRET,
                "grant_types": ["client_credentials"],
                "response_types": [],
                "redirect_uris": [],
                "service_account": {"realm_access": {"roles": KEYCLOAK_DEFAULT_ROLES}},
            },
        ],
        "resources": {
            API_RESOURCE: {"audience": API_AUDIENCE, "scope": "api"},
            OTHER_RESOURCE: {"audience": OTHER_AUDIENCE, "scope": "reports"},
        },
        "default_resource": API_RESOURCE,
        "accounts": default_personas(),
    }
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "oidc-provider.json"
    port = free_port()
    process = ManagedProcess(
        f"oidc-provider-{port}",
        ["node", str(HERE / "provider.js")],
        env={"OIDC_CONFIG": str(config_path), "OIDC_PORT": str(port), "NODE_ENV": "test"},
        cwd=HERE,
    )
    provider = Provider(process, port, config_path, config, private_key, kid)
    provider._write()
    discovery = f"{provider.issuer}/.well-known/openid-configuration"
    process.start(ready=http_ready(discovery, expect=200), timeout=30)
    return provider


# --- a browser without a browser ---------------------------------------------------------------
@dataclass
class Form:
    action: str
    method: str
    fields: dict[str, str] = field(default_factory=dict)


class _FormParser(HTMLParser):
    """Forms by id (or position), with inputs and named buttons, including form="id" ones."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: dict[str, Form] = {}
        self._current: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self._current = a.get("id") or f"form{len(self.forms)}"
            self.forms[self._current] = Form(a.get("action", ""), a.get("method", "get").lower())
        elif tag in ("input", "button") and a.get("name"):
            owner = a.get("form") or self._current
            if owner in self.forms:
                self.forms[owner].fields[a["name"]] = a.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._current = None


def forms_in(html: str) -> dict[str, Form]:
    parser = _FormParser()
    parser.feed(html)
    return parser.forms


class Browser:
    """An HTTP client with a cookie jar that follows redirects and submits forms."""

    def __init__(self) -> None:
        self.http = httpx.Client(follow_redirects=True, timeout=15)

    def close(self) -> None:
        self.http.close()

    def get(self, url: str, **params: str) -> httpx.Response:
        return self.http.get(url, params=params or None)

    def submit(self, page: httpx.Response, form_id: str, **values: str) -> httpx.Response:
        form = forms_in(page.text)[form_id]
        target = urljoin(str(page.url), form.action or str(page.url))
        return self.http.request(form.method.upper(), target, data={**form.fields, **values})

    @staticmethod
    def is_provider_login(page: httpx.Response) -> bool:
        return "kc-form-login" in forms_in(page.text)

    def sso_login(
        self, portal: str, username: str, password: str, next_url: str = "/"
    ) -> httpx.Response:
        """Start at the portal's SSO link; sign in at the provider if it asks."""
        page = self.get(f"{portal}/oidc/authenticate/", next=next_url)
        if self.is_provider_login(page):
            page = self.submit(page, "kc-form-login", username=username, password=password)
        return page

    def csrf_token(self, portal: str) -> str:
        self.get(f"{portal}/")
        token = next((c.value for c in self.http.cookies.jar if c.name == "csrftoken"), None)
        assert token, "the portal set no CSRF cookie"
        return token

    def sso_logout(self, portal: str) -> httpx.Response:
        """Sign out of the portal (POST, as the page's button does); confirm at the provider."""
        page = self.http.post(
            f"{portal}/oidc/logout/", data={"csrfmiddlewaretoken": self.csrf_token(portal)}
        )
        if "op.logoutForm" in forms_in(page.text):
            page = self.submit(page, "op.logoutForm", logout="yes")
        return page


def environment_without_sso() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_OIDC_")}


_SETTINGS_SCRIPT = """
import json, runpy, sys
names = ("AUTHENTICATION_BACKENDS", "LOGIN_URL", "LOCAL_LOGIN_ENABLED")
ns = runpy.run_path("config/settings.py")
keep = {k: v for k, v in ns.items() if k.startswith(("OIDC_", "SSO_")) or k in names}
json.dump(keep, sys.stdout)
"""


def settings_from_environment(**variables: str) -> dict[str, Any]:
    """What config/settings.py makes of these SWITCHYARD_* variables, in a fresh interpreter."""
    result = subprocess.run(
        [PYTHON, "-c", _SETTINGS_SCRIPT],
        cwd=REPO_ROOT,
        env={**environment_without_sso(), **variables},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise SettingsRefused(result.stderr.strip().splitlines()[-1] if result.stderr else "")
    values: dict[str, Any] = json.loads(result.stdout)
    return values


class SettingsRefused(Exception):
    """config/settings.py refused to load; the message is its last line of error output."""
