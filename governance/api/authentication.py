"""Keycloak service-account tokens on /api/: ``Authorization: Bearer <JWT>``.

Automation gets a token with the client-credentials grant and presents it here. The token is
verified against the realm's published keys (RS256; the key set is cached and refetched at
most every 30 s for an unknown ``kid``), its issuer, expiry, audience and, if configured, the
client it was issued to. It maps to the Django user ``service-account-<client_id>`` with roles
and tenants from the same claim mapping as SSO logins (``portal.sso``).

A bearer value that is not a JWT (an ``sk-…`` API key) is left to other authenticators, and
requests without a bearer token are untouched, so session authentication works as before.
Failures answer 401 with ``WWW-Authenticate: Bearer`` whatever the order of the classes.
"""

from __future__ import annotations

import ssl
import threading
from typing import Any

import jwt
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from rest_framework import exceptions, status
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from governance.audit import Actor
from governance.identity import SSORefused, identity_from_claims, sso_user_sync

ALGORITHM = "RS256"
SERVICE_ACCOUNT_PREFIX = "service-account-"
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
        header = jwt.get_unverified_header(token)
    except jwt.DecodeError as exc:
        raise InvalidBearerToken("The bearer token is not a well-formed JWT.") from exc
    if header.get("alg") != ALGORITHM:
        raise InvalidBearerToken(f"The bearer token must be signed with {ALGORITHM}.")
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise InvalidBearerToken("The bearer token names no signing key (kid).")
    try:
        signing_key = _jwk_client().get_signing_key(kid)
    except jwt.PyJWKClientConnectionError as exc:
        raise IdentityProviderUnavailable() from exc
    except jwt.PyJWKClientError as exc:
        raise InvalidBearerToken(
            "The bearer token is signed by a key the identity provider does not publish."
        ) from exc
    audience = settings.SSO_API_AUDIENCE
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            signing_key.key,
            algorithms=[ALGORITHM],
            issuer=settings.SSO_ISSUER,
            audience=audience or None,
            leeway=settings.SSO_API_LEEWAY_SECONDS,
            options={"require": ["exp", "iat", "iss"], "verify_aud": bool(audience)},
        )
    except jwt.ExpiredSignatureError as exc:
        raise InvalidBearerToken("The bearer token has expired.") from exc
    except jwt.InvalidIssuerError as exc:
        raise InvalidBearerToken(
            f"The bearer token was not issued by {settings.SSO_ISSUER}."
        ) from exc
    except (jwt.InvalidAudienceError, jwt.MissingRequiredClaimError) as exc:
        if isinstance(exc, jwt.MissingRequiredClaimError) and exc.claim != "aud":
            raise InvalidBearerToken(f"The bearer token has no {exc.claim!r} claim.") from exc
        raise InvalidBearerToken(
            f"The bearer token is not meant for this API (its audience must include {audience!r})."
        ) from exc
    except jwt.InvalidSignatureError as exc:
        raise InvalidBearerToken("The bearer token's signature does not verify.") from exc
    except jwt.ImmatureSignatureError as exc:
        raise InvalidBearerToken("The bearer token is not valid yet.") from exc
    except jwt.InvalidTokenError as exc:
        raise InvalidBearerToken(f"The bearer token is invalid: {exc}.") from exc
    _check_client(claims)
    return claims


def _client_of(claims: dict[str, Any]) -> str:
    client = claims.get("azp") or claims.get("client_id")
    return client if isinstance(client, str) else ""


def _check_client(claims: dict[str, Any]) -> None:
    client = _client_of(claims)
    if not client:
        raise InvalidBearerToken("The bearer token names no client (azp).")
    allowed = settings.SSO_API_CLIENTS
    if allowed and client not in allowed:
        raise InvalidBearerToken(f"Client {client!r} may not use this API.")
    # Keycloak names a client's service account "service-account-<client_id>"; a person's
    # token obtained through the same client carries their own username and is refused here.
    username = claims.get("preferred_username", SERVICE_ACCOUNT_PREFIX + client)
    if username != SERVICE_ACCOUNT_PREFIX + client:
        raise InvalidBearerToken(
            "Only service-account tokens (client-credentials grant) are accepted on the API."
        )


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
