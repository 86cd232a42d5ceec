"""The embedded demo's governance records: one tenant, one approved use case, the fleet."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction

from governance.choices import (
    ApiKeyStatus,
    Environment,
    Namespace,
    UseCaseKind,
    UseCaseStatus,
)
from governance.models import ApiKey, Deployment, Model, Tenant, UseCase
from governance.services import api_key_issue

DEMO_TENANT = "demo"
DEMO_USE_CASE = "demo-assistant"
DEMO_KEY_NAME = "embedded demo key"


@dataclass(frozen=True)
class FleetModel:
    public_id: str
    capabilities: list[str]
    replicas: list[str]
    timeout_seconds: float = 60.0
    max_tokens: int | None = None


@dataclass(frozen=True)
class DemoSeed:
    key_plaintext: str
    admin_username: str
    admin_password: str | None  # None when the admin already existed


def parse_fleet_arg(value: str) -> FleetModel:
    """``NAME=CAP[+CAP]=URL[,URL]``, e.g. ``llama=chat+completions=http://127.0.0.1:8101``."""
    try:
        name, caps, urls = value.split("=", 2)
    except ValueError as exc:
        raise ValueError(f"--model {value!r}: expected NAME=CAPABILITIES=URL[,URL]") from exc
    replicas = [u for u in urls.split(",") if u]
    if not name or not caps or not replicas:
        raise ValueError(f"--model {value!r}: name, capabilities and a URL are all required")
    return FleetModel(public_id=name, capabilities=caps.split("+"), replicas=replicas)


@transaction.atomic
def demo_seed(*, fleet: list[FleetModel], admin_password: str) -> DemoSeed:
    """Create or refresh the demo; mint a fresh key and revoke the previous demo keys.

    Re-running is safe: rows are updated in place (the fleet's ports may have changed), and
    since plaintext keys are never stored, each run mints a new key to print.
    """
    tenant, _ = Tenant.objects.update_or_create(
        slug=DEMO_TENANT,
        defaults={
            "name": "Demo business unit",
            "business_unit": "Platform demo",
            "application_id": "APP-0000",
            "environment": Environment.DEV,
        },
    )
    use_case, _ = UseCase.objects.update_or_create(
        tenant=tenant,
        slug=DEMO_USE_CASE,
        defaults={
            "name": "Demo assistant",
            "kind": UseCaseKind.CHATBOT,
            "purpose": "Try Switchyard end to end on the embedded stack.",
            "status": UseCaseStatus.APPROVED,
            "namespace": Namespace.DEV,
        },
    )
    models = []
    for entry in fleet:
        model, _ = Model.objects.update_or_create(
            public_id=entry.public_id,
            defaults={
                "capabilities": entry.capabilities,
                "timeout_seconds": entry.timeout_seconds,
                "max_tokens": entry.max_tokens,
            },
        )
        model.full_clean()
        Deployment.objects.filter(model=model).delete()
        deployment = Deployment(model=model, served_name=entry.public_id, replicas=entry.replicas)
        deployment.full_clean()
        deployment.save()
        models.append(model)
    use_case.allowed_models.set(models)

    ApiKey.objects.filter(use_case=use_case, name=DEMO_KEY_NAME).update(status=ApiKeyStatus.REVOKED)
    _, plaintext = api_key_issue(use_case=use_case, name=DEMO_KEY_NAME)

    user_model = get_user_model()
    created_password: str | None = None
    if not user_model.objects.filter(username="admin").exists():
        user_model.objects.create_superuser("admin", "admin@example.invalid", admin_password)
        created_password = admin_password
    return DemoSeed(
        key_plaintext=plaintext, admin_username="admin", admin_password=created_password
    )
