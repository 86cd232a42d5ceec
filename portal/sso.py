"""Single sign-on with Keycloak: the OIDC views (claims → access lives in governance.identity).

Keycloak is the source of truth for who is an officer, developer, auditor or admin and which
tenants a developer works on: every SSO login (and every service-account token on the API)
makes the Django user match its claims, and every change is written to the audit trail.
mozilla-django-oidc runs the authorization-code flow; the views here only gate it on SSO being
configured and show a refusal on the sign-in page instead of a bare redirect.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import urlencode

import requests
from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render, resolve_url
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from governance.audit import Actor, audit_record

logger = logging.getLogger(__name__)

# The session key under which the backend leaves a refusal for the callback view to show.
REFUSAL_SESSION_KEY = "switchyard_sso_refusal"


def _require_sso() -> None:
    if not settings.SSO_ENABLED:
        raise Http404("Single sign-on is not configured.")


def _sign_in_page(request: HttpRequest, message: str, *, status: int) -> HttpResponse:
    return render(request, "registration/login.html", {"sso_error": message}, status=status)


class SSOAuthenticationRequestView(OIDCAuthenticationRequestView):  # type: ignore[misc]
    """Sends the browser to Keycloak (with state, nonce and PKCE)."""

    def get(self, request: HttpRequest) -> HttpResponse:
        _require_sso()
        response: HttpResponse = super().get(request)
        return response


class SSOCallbackView(OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """Keycloak's redirect back: signs the user in, or explains on the sign-in page why not."""

    def get(self, request: HttpRequest) -> HttpResponse:
        _require_sso()
        try:
            response: HttpResponse = super().get(request)
        except SuspiciousOperation as exc:
            # A replayed or stale callback (state already used), or a token that failed its
            # checks: nothing to retry with this URL, so start again.
            logger.warning("event=sso_callback_rejected reason=%r", str(exc))
            return _sign_in_page(
                request,
                "This sign-in attempt is no longer valid. Please sign in again.",
                status=400,
            )
        except requests.RequestException as exc:
            logger.error("event=sso_provider_unreachable error=%r", str(exc))
            return _sign_in_page(
                request,
                "The identity provider cannot be reached right now. Try again shortly.",
                status=502,
            )
        return response

    def login_failure(self) -> HttpResponse:
        request: HttpRequest = self.request
        message = request.session.pop(REFUSAL_SESSION_KEY, None)
        if message is None:
            # Only a short error code is echoed, never the free-text description: this URL can
            # be crafted by anyone.
            error = re.sub(r"[^a-z_]", "", request.GET.get("error", ""))[:40]
            message = (
                f"The identity provider did not sign you in ({error})."
                if error
                else "Sign-in with single sign-on failed. Please try again."
            )
        return _sign_in_page(request, message, status=403)


def provider_logout_url(request: HttpRequest) -> str:
    """Where the browser goes after signing out here: Keycloak's end-session endpoint.

    mozilla-django-oidc calls this (OIDC_OP_LOGOUT_URL_METHOD) before it ends the Django
    session. With the ID token as id_token_hint, Keycloak ends its own session too, so the
    next sign-in asks for credentials again; it then returns to ``post_logout_redirect_uri``.
    """
    after = resolve_url(settings.LOGOUT_REDIRECT_URL or "/")
    id_token = request.session.get("oidc_id_token")
    if not settings.SSO_ENABLED or not id_token:
        return after
    user = request.user
    if user.is_authenticated:
        audit_record(actor=Actor.from_request(request), action="user.logout_sso", obj=user)
    query = urlencode(
        {
            "id_token_hint": id_token,
            "post_logout_redirect_uri": request.build_absolute_uri(after),
            "client_id": settings.OIDC_RP_CLIENT_ID,
        }
    )
    return f"{settings.SSO_END_SESSION_ENDPOINT}?{query}"
