"""The Keycloak login backend: mozilla-django-oidc's, with Switchyard's users, roles and tenants.

mozilla-django-oidc exchanges the code, verifies the ID token (RS256 against the realm's JWKS,
nonce, expiry) and fetches userinfo; this backend adds the checks it leaves out (issuer and
audience of the ID token, userinfo about the same subject) and turns the claims into a Django
user through :func:`portal.sso.sso_user_sync`. A refusal is remembered in the session for the
callback view to show on the sign-in page.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from governance.audit import Actor, audit_record
from governance.identity import SSORefused, identity_from_claims, sso_access, sso_user_sync
from portal.sso import REFUSAL_SESSION_KEY

logger = logging.getLogger(__name__)


class SwitchyardOIDCBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    def get_userinfo(
        self, access_token: str, id_token: str, payload: dict[str, Any]
    ) -> dict[str, Any]:
        """The ID token's claims, completed by userinfo (Keycloak may put roles in either)."""
        _check_id_token(payload)
        userinfo: dict[str, Any] = super().get_userinfo(access_token, id_token, payload)
        if userinfo.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("userinfo describes another subject than the ID token")
        return {**payload, **userinfo}

    def get_or_create_user(
        self, access_token: str, id_token: str, payload: dict[str, Any]
    ) -> AbstractBaseUser | None:
        claims = self.get_userinfo(access_token, id_token, payload)
        origin = Actor.from_request(self.request)
        username = claims.get("preferred_username")
        if not isinstance(username, str) or not username.strip():
            self._refuse("The identity provider did not say who you are (no preferred_username).")
            return None
        try:
            user = sso_user_sync(
                identity=identity_from_claims(claims, username=username.strip()[:150]),
                origin=origin,
            )
        except SSORefused as refusal:
            logger.info("event=sso_login_refused username=%s", username)
            self._refuse(str(refusal))
            return None
        audit_record(
            actor=Actor.for_user(user, request_id=origin.request_id, source_ip=origin.source_ip),
            action="user.login_sso",
            obj=user,
            after=sso_access(user),
        )
        logger.info("event=sso_login username=%s", username)
        return user

    def _refuse(self, message: str) -> None:
        self.request.session[REFUSAL_SESSION_KEY] = message


def _check_id_token(payload: dict[str, Any]) -> None:
    # mozilla-django-oidc verifies the signature, expiry and nonce but not who issued the
    # token or for whom: a token another client of the realm obtained must not sign anyone in.
    if payload.get("iss") != settings.SSO_ISSUER:
        raise SuspiciousOperation(
            f"ID token issuer {payload.get('iss')!r} is not {settings.SSO_ISSUER!r}"
        )
    audience = payload.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    if settings.OIDC_RP_CLIENT_ID not in audiences:
        raise SuspiciousOperation("ID token is not addressed to this client")
