"""Small factories for governance records, with the personas the tests speak of.

alice is a developer of tenant acme, bob a developer of tenant globex, olivia a governance
officer, audrey an auditor, root an admin, mallory has an account but no role.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser

from governance.audit import Actor
from governance.choices import Environment, UseCaseKind, UseCaseStatus
from governance.models import ApiKey, Deployment, Model, Tenant, UseCase
from governance.roles import Role, roles_set
from governance.services.api_keys import api_key_issue

PASSWORD = "pw-for-tests-1234"


def make_user(username: str, *roles: Role, tenants: tuple[Tenant, ...] = ()) -> AbstractUser:
    user = get_user_model().objects.create_user(username, f"{username}@example.invalid", PASSWORD)
    roles_set(user, roles)
    for tenant in tenants:
        tenant.members.add(user)
    return user


def make_tenant(slug: str = "acme", environment: str = Environment.PROD, **fields: Any) -> Tenant:
    defaults = {
        "name": slug.title(),
        "business_unit": f"{slug.title()} BU",
        "application_id": "APP-1000",
        "owner_email": f"owner@{slug}.example",
    }
    return Tenant.objects.create(slug=slug, environment=environment, **{**defaults, **fields})


def make_model(public_id: str = "llama", replicas: list[str] | None = None, **fields: Any) -> Model:
    model = Model.objects.create(
        public_id=public_id,
        capabilities=fields.pop("capabilities", ["chat", "completions"]),
        **fields,
    )
    Deployment.objects.create(
        model=model, served_name=public_id, replicas=replicas or ["http://127.0.0.1:9"]
    )
    return model


def make_use_case(
    tenant: Tenant,
    slug: str = "chatbot",
    *,
    models: tuple[Model, ...] = (),
    status: str = UseCaseStatus.APPROVED,
    **fields: Any,
) -> UseCase:
    use_case = UseCase.objects.create(
        tenant=tenant,
        slug=slug,
        name=slug.title(),
        kind=fields.pop("kind", UseCaseKind.CHATBOT),
        purpose=fields.pop("purpose", "Answer customer questions."),
        status=status,
        namespace=fields.pop("namespace", "prod"),
        **fields,
    )
    use_case.allowed_models.set(models)
    return use_case


def make_key(use_case: UseCase, name: str = "ci") -> tuple[ApiKey, str]:
    """An active key minted by the platform (skipping the request/approve/reveal dance)."""
    return api_key_issue(actor=Actor.system("tests"), use_case=use_case, name=name)
