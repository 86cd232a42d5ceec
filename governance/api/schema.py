"""The OpenAPI description of /api/: our authentication classes, our list fields, and the
error answers every operation can give (drf-spectacular extensions and the AutoSchema).

The schema is a contract that clients and schemathesis hold the API to, so it states what the
server really accepts and every status code it really answers.
"""

from __future__ import annotations

from typing import Any, Literal

from django.core.validators import RegexValidator
from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerExtension,
    OpenApiSerializerFieldExtension,
)
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.plumbing import analyze_named_regex_pattern, anchor_pattern
from rest_framework import serializers

from governance.api.serializers import ErrorSerializer, UniqueListField
from governance.choices import RateLimitScope

Direction = Literal["request", "response"]


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


class ApiKeyScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "governance.api.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An active API key of the use case (sk-sy-…); /api/files/ only.",
        }


class UniqueListFieldExtension(OpenApiSerializerFieldExtension):  # type: ignore[no-untyped-call]
    """A list without repeats: the items' own schema, plus ``uniqueItems``."""

    target_class = UniqueListField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema: dict[str, Any] = auto_schema._map_serializer_field(
            self.target, direction, bypass_extensions=True
        )
        schema["uniqueItems"] = True
        return schema


class RateLimitPolicyExtension(OpenApiSerializerExtension):  # type: ignore[no-untyped-call]
    """A whole rate-limit policy (create, replace) as its clean() requires it: the scope says
    whether it names a model and a tenant, and at least one limit is set. A PATCH merges into
    the stored policy, so its body alone is checked by the server only."""

    target_class = "governance.api.serializers.RateLimitPolicySerializer"

    def map_serializer(self, auto_schema: Any, direction: Direction) -> dict[str, Any]:
        schema: dict[str, Any] = auto_schema._map_serializer(
            self.target, direction, bypass_extensions=True
        )
        if direction != "request" or auto_schema.method == "PATCH":
            return schema
        named = {"type": "string"}  # present, and not null
        unnamed = {"not": {"type": "string"}}  # absent or null
        variants = []
        for scope in RateLimitScope:
            needs = {
                "model": scope in (RateLimitScope.MODEL, RateLimitScope.TENANT_MODEL),
                "tenant": scope in (RateLimitScope.TENANT, RateLimitScope.TENANT_MODEL),
            }
            variant: dict[str, Any] = {
                "properties": {
                    # (in allOf: drf-spectacular would fold a bare enum into the scope enum)
                    "scope": {"allOf": [{"enum": [scope.value]}]},
                    **{field: named if need else unnamed for field, need in needs.items()},
                }
            }
            if required := [field for field, need in needs.items() if need]:
                variant["required"] = required
            variants.append(variant)
        schema["oneOf"] = variants
        schema["anyOf"] = [
            {"properties": {limit: {"type": "integer"}}, "required": [limit]}
            for limit in ("requests_per_minute", "tokens_per_minute", "tokens_per_day")
        ]
        return schema


# A 400's body: field name → messages (or nested errors for nested fields); ``detail`` for
# problems that belong to no one field.
VALIDATION_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Field name → what is wrong with it; `detail` or `non_field_errors` "
    "for problems of the whole request.",
    "additionalProperties": {},
}

# What DRF's CharField takes: no NUL anywhere and, as it strips whitespace first, one character
# that is not whitespace. Never the empty string: a blank-allowed field gets drf-spectacular's
# `oneOf` with the empty string, which must then match one branch only.
NO_NUL = "^[^\\u0000]+$"
NO_NUL_NOT_BLANK = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"
_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class AutoSchema(SpectacularAutoSchema):
    """drf-spectacular's AutoSchema, plus the error responses of governance.api.exceptions."""

    _direction: str | None = None

    def _map_basic_serializer(self, serializer: Any, direction: str) -> dict[str, Any]:
        # Remember for _insert_field_validators, which drf-spectacular calls without it.
        outer, self._direction = self._direction, direction
        try:
            parent: Any = super()
            schema: dict[str, Any] = parent._map_basic_serializer(serializer, direction)
        finally:
            self._direction = outer
        return schema

    def _resolve_path_parameters(self, variables: list[str]) -> list[dict[str, Any]]:
        """State the URL's own pattern for a lookup (a router's ``[^/.]+``): a value outside it
        never reaches the API, so it is not a value the operation takes."""
        parent: Any = super()
        parameters: list[dict[str, Any]] = parent._resolve_path_parameters(variables)
        patterns = analyze_named_regex_pattern(self.path_regex)
        for parameter in parameters:
            schema = parameter["schema"]
            pattern = patterns.get(parameter["name"])
            if schema.get("type") == "string" and "pattern" not in schema and pattern:
                schema["pattern"] = anchor_pattern(pattern)
        return parameters

    def _insert_field_validators(self, field: Any, schema: dict[str, Any]) -> None:
        # DRF refuses NUL in every CharField (and a blank one unless allowed); say so where
        # no pattern, format or enum says more. Requests only: answers are what is stored.
        if (
            self._direction != "response"
            and isinstance(field, serializers.CharField)
            and schema.get("type") == "string"
            and not {"pattern", "format", "enum"} & schema.keys()
            and not any(isinstance(v, RegexValidator) for v in field.validators)
        ):
            schema["pattern"] = NO_NUL_NOT_BLANK if field.trim_whitespace else NO_NUL
        parent: Any = super()
        parent._insert_field_validators(field, schema)

    def map_parsers(self) -> list[Any]:
        """Request bodies are JSON. DRF still parses forms (the browsable API posts them),
        but a form cannot carry the lists, objects and nulls these records hold."""
        return [media for media in super().map_parsers() if media == "application/json"]

    def _get_response_bodies(self, direction: Direction = "response") -> dict[str, Any]:
        parent: Any = super()
        responses: dict[str, Any] = parent._get_response_bodies(direction)
        errors: dict[str, Any] = {
            "401": "Not signed in, or the credentials are not valid.",
            "403": "Signed in, but this role may not do this.",
        }
        places = {parameter["in"] for parameter in self._get_parameters()}
        has_body = parent._get_request_body() is not None
        if "query" in places or has_body:
            errors["400"] = VALIDATION_ERROR_SCHEMA
        if places or has_body:
            # A record the path or body names does not exist or is out of the caller's scope,
            # or a page past the end.
            errors["404"] = "No such record (or not one this account may see)."
        if self.method in _UNSAFE:
            errors["409"] = "The record's state forbids it, or other records still refer to it."
        for code, description in errors.items():
            if code in responses:
                continue
            if isinstance(description, dict):
                responses[code] = parent._get_response_for_code(description, code, None, direction)
                responses[code]["description"] = "The request is not valid."
            else:
                responses[code] = parent._get_response_for_code(
                    ErrorSerializer, code, None, direction
                )
                responses[code]["description"] = description
        return dict(sorted(responses.items()))
