"""Governance records. Rules that span rows live in services.py, not here."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models

from governance.choices import (
    ApiKeyStatus,
    Capability,
    Environment,
    Namespace,
    UseCaseKind,
    UseCaseStatus,
)

slug_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9-]{0,62}$", "Use lowercase letters, digits and hyphens (max 63)."
)
model_id_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$",
    "Use letters, digits and . _ : / - (max 128), starting with a letter or digit.",
)


class Tenant(models.Model):
    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    business_unit = models.CharField(max_length=200, blank=True)
    application_id = models.CharField(max_length=64, blank=True, help_text="CMDB application id")
    environment = models.CharField(max_length=8, choices=Environment.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return f"{self.name} ({self.environment})"


class Model(models.Model):
    """A model as clients name it: the public id in ``model`` of an OpenAI request."""

    public_id = models.CharField(max_length=128, unique=True, validators=[model_id_validator])
    capabilities = models.JSONField(default=list, help_text="chat, completions, embeddings, …")
    timeout_seconds = models.FloatField(default=60.0, validators=[MinValueValidator(0.1)])
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["public_id"]

    def __str__(self) -> str:
        return self.public_id

    def clean(self) -> None:
        allowed = set(Capability.values)
        if not isinstance(self.capabilities, list) or not self.capabilities:
            raise ValidationError({"capabilities": "List at least one capability."})
        unknown = [c for c in self.capabilities if c not in allowed]
        if unknown:
            raise ValidationError(
                {"capabilities": f"Unknown capability {unknown[0]!r}; use {sorted(allowed)}."}
            )


class Deployment(models.Model):
    """Where a model runs: a set of vLLM replicas serving it under one served name."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="deployments")
    served_name = models.CharField(max_length=128, validators=[model_id_validator])
    replicas = models.JSONField(default=list, help_text="Base URLs of the vLLM replicas")
    node_pool = models.CharField(max_length=64, blank=True)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model__public_id", "id"]

    def __str__(self) -> str:
        return f"{self.model} → {self.served_name} ×{len(self.replicas)}"

    def clean(self) -> None:
        if not isinstance(self.replicas, list) or not all(
            isinstance(url, str) and url.startswith(("http://", "https://"))
            for url in self.replicas
        ):
            raise ValidationError({"replicas": "Give a list of http(s):// base URLs."})


class UseCase(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="use_cases")
    slug = models.CharField(max_length=63, validators=[slug_validator])
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=UseCaseKind.choices)
    purpose = models.TextField(blank=True)
    status = models.CharField(
        max_length=12, choices=UseCaseStatus.choices, default=UseCaseStatus.DRAFT
    )
    namespace = models.CharField(max_length=8, choices=Namespace.choices, default=Namespace.DEV)
    allowed_models = models.ManyToManyField(Model, blank=True, related_name="use_cases")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__slug", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="use_case_slug_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.slug}"


class ApiKey(models.Model):
    """An API key, stored only as its SHA-256; the plaintext is shown once at creation."""

    use_case = models.ForeignKey(UseCase, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=16, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    status = models.CharField(
        max_length=10, choices=ApiKeyStatus.choices, default=ApiKeyStatus.PENDING
    )
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.use_case})"
