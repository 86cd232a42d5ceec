"""OpenAPI descriptions for our own authentication classes (drf-spectacular extensions)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ServiceAccountJWTScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "governance.api.authentication.ServiceAccountJWTAuthentication"
    name = "serviceAccountJWT"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "JWT",
            "description": "A Keycloak service-account access token (client-credentials grant).",
        }
