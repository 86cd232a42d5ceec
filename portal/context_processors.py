from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def switchyard(request: HttpRequest) -> dict[str, object]:
    return {
        "gateway_url": settings.GATEWAY_PUBLIC_URL,
        "local_login_enabled": settings.LOCAL_LOGIN_ENABLED,
        "sso_enabled": settings.SSO_ENABLED,
        "embedded_mode": not settings.PRODUCTION,
    }
