"""Keycloak service-account tokens on /api/: ``Authorization: Bearer <JWT>``.

Automation gets a token with the client-credentials grant and presents it here. The token is
verified against the realm's published keys (RS256; the key set is cached and refetched at
most every 30 s for an unknown ``kid``), then by the rules the gateway applies on /v1
(gateway.service_accounts: issuer, expiry, audience, and the client it was issued to, on
the allow-list if there is one; only service-account tokens). It maps to the Django user
``service-account-<client_id>`` with roles and tenants from the same claim mapping as SSO
logins (``portal.sso``).

A bearer value that is not a JWT (an ``sk-…`` API key) is left to other authenticators, and
requests without a bearer token are untouched, so session authentication works as before.
Failures answer 401 with ``WWW-Authenticate: Bearer`` whatever the order of the classes.
"""

from __future__ import annotations

import hmac
import ssl
import threading
from typing import Any, Literal

import jwt
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from rest_framework import exceptions, status
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from gateway.service_accounts import (
    SERVICE_ACCOUNT_PREFIX,
    TokenRefused,
    check_client,
    decode_claims,
    signing_kid,
)
from governance.audit import Actor
from governance.identity import SSORefused, identity_from_claims, sso_user_sync
from governance.keys import KEY_PREFIX, key_hash
from governance.models import ApiKey
from governance.selectors import api_keys_live

_CHALLENGE = 'Bearer realm="switchyard"'


class InvalidBearerToken(exceptions.APIException):
    """401 with a Bearer challenge (not AuthenticationFailed, whose status DRF may turn to 403)."""

    status_code = status.HTTP_401_UNAUTHORIZED
    default_code = "invalid_token"
    auth_header = f'{_CHALLENGE}, error="invalid_token"'


class IdentityProviderUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The identity provider's signing keys cannot be fetched right now."
    default_code = "identity_provider_unavailable"


_jwk_clients: dict[tuple[str, bool, int], jwt.PyJWKClient] = {}
_jwk_clients_lock = threading.Lock()


def _jwk_client() -> jwt.PyJWKClient:
    """One caching key-set client per JWKS URL (settings may differ between tests)."""
    key = (settings.OIDC_OP_JWKS_ENDPOINT, settings.OIDC_VERIFY_SSL, settings.OIDC_TIMEOUT)
    with _jwk_clients_lock:
        client = _jwk_clients.get(key)
        if client is None:
            context = None if settings.OIDC_VERIFY_SSL else _unverified_tls()
            client = jwt.PyJWKClient(
                settings.OIDC_OP_JWKS_ENDPOINT,
                cache_jwk_set=True,
                lifespan=300,
                timeout=settings.OIDC_TIMEOUT,
                ssl_context=context,
                cooldown_duration=30,  # an unknown kid refetches the set at most this often
            )
            _jwk_clients[key] = client
        return client


def _unverified_tls() -> ssl.SSLContext:
    # Only with SWITCHYARD_OIDC_VERIFY_SSL=false, for a Keycloak with a private CA in a lab.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def verify_service_token(token: str) -> dict[str, Any]:
    """The claims of a valid service-account token; InvalidBearerToken says what is wrong."""
    try:
        kid = signing_kid(token)
    except TokenRefused as exc:
        raise InvalidBearerToken(str(exc)) from exc
    try:
        signing_key = _jwk_client().get_signing_key(kid)
    except jwt.PyJWKClientConnectionError as exc:
        raise IdentityProviderUnavailable() from exc
    except jwt.PyJWKClientError as exc:
        raise InvalidBearerToken(
            "The bearer token is signed by a key the identity provider does not publish."
        ) from exc
    try:
        claims = decode_claims(
            token,
            signing_key.key,
            issuer=settings.SSO_ISSUER,
            audience=settings.SSO_API_AUDIENCE,
            leeway_s=settings.SSO_API_LEEWAY_SECONDS,
        )
        check_client(claims, frozenset(settings.SSO_API_CLIENTS))
    except TokenRefused as exc:
        raise InvalidBearerToken(str(exc)) from exc
    return claims


def _client_of(claims: dict[str, Any]) -> str:
    client = claims.get("azp") or claims.get("client_id")
    return client if isinstance(client, str) else ""


class ServiceAccountJWTAuthentication(BaseAuthentication):
    """DRF authentication for Keycloak service-account JWTs (see the module docstring)."""

    def authenticate(self, request: Request) -> tuple[AbstractBaseUser, dict[str, Any]] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != b"bearer":
            return None
        if len(parts) != 2:
            raise InvalidBearerToken("The Authorization header must be 'Bearer <token>'.")
        try:
            token = parts[1].decode("ascii")
        except UnicodeDecodeError as exc:
            raise InvalidBearerToken("The bearer token is not a well-formed JWT.") from exc
        if token.count(".") != 2:
            return None  # an API key or another kind of bearer token: not ours to judge
        if not settings.SSO_API_ENABLED:
            raise InvalidBearerToken("This server does not accept identity-provider tokens.")
        claims = verify_service_token(token)
        username = (SERVICE_ACCOUNT_PREFIX + _client_of(claims))[:150]
        identity = identity_from_claims(claims, username=username)
        try:
            # Refusals are not audited per request (a misconfigured job would flood the
            # trail); role changes are.
            user = sso_user_sync(
                identity=identity, origin=Actor.from_request(request._request), audit_refusals=False
            )
        except SSORefused as refusal:
            raise exceptions.PermissionDenied(str(refusal)) from refusal
        return user, claims

    def authenticate_header(self, request: Request) -> str:
        return _CHALLENGE


class ApiKeyUser(AnonymousUser):
    """The principal of a request made with an API key: authenticated, no person, no role.

    Only the file-registration endpoints accept keys (docs/files.md): a key stands for its
    use case there, and the views check ``request.auth`` (the ApiKey), never roles."""

    def __init__(self, key: ApiKey) -> None:
        super().__init__()
        self.key = key
        self.name = f"key:{key.prefix}"

    @property
    def is_anonymous(self) -> Literal[False]:  # type: ignore[override]
        return False

    @property
    def is_authenticated(self) -> Literal[True]:  # type: ignore[override]
        return True

    def get_username(self) -> str:
        return self.name

    def __str__(self) -> str:
        return self.name


class ApiKeyAuthentication(BaseAuthentication):
    """``Authorization: Bearer sk-sy-…``: an active, unexpired API key of an approved use
    case (``api_keys_live``), found by the SHA-256 of the key (as the gateway does: the
    database compares hashes, never the secret, so no timing tells anything about a key),
    mapped to its use case. Every door of the web process that takes a key uses this class,
    so this is where the key's and its use case's status are checked, once."""

    def authenticate(self, request: Request) -> tuple[ApiKeyUser, ApiKey] | None:
        parts = get_authorization_header(request).split()
        if len(parts) != 2 or parts[0].lower() != b"bearer":
            return None
        try:
            token = parts[1].decode("ascii")
        except UnicodeDecodeError:
            return None
        if not token.startswith(KEY_PREFIX):
            return None
        digest = key_hash(token)
        # Checked on every request, on every door that takes a key: a key stops acting the
        # moment its use case is suspended or retired, as it does at the gateway. One answer
        # for every reason (as the gateway's), so a refusal says nothing about other keys.
        key = api_keys_live().filter(key_hash=digest).first()
        if key is None or key.key_hash is None or not hmac.compare_digest(key.key_hash, digest):
            raise InvalidBearerToken(
                "The API key is not valid (unknown, revoked or expired, or its use case is "
                "not approved)."
            )
        return ApiKeyUser(key), key

    def authenticate_header(self, request: Request) -> str:
        return _CHALLENGE
