"""Who may read and change what through /api/: every role × endpoint × own/other tenant.

alice develops for acme; bob for globex (so acme's records are "other tenant" to him);
olivia is an officer, audrey an auditor, root an admin, mallory has no role. Objects outside
a person's scope are 404 (their existence does not leak), actions beyond their role 403.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from governance.audit import Actor, audit_record
from governance.models import GuardrailSelection, PriorityRule, RateLimitPolicy
from governance.roles import Role
from tests.factories import make_key, make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> dict[str, Any]:
    acme, globex = make_tenant("acme"), make_tenant("globex")
    llama = make_model("llama")
    users = {
        "alice": make_user("alice", Role.DEVELOPER, tenants=(acme,)),
        "bob": make_user("bob", Role.DEVELOPER, tenants=(globex,)),
        "olivia": make_user("olivia", Role.OFFICER),
        "audrey": make_user("audrey", Role.AUDITOR),
        "root": make_user("root", Role.ADMIN),
        "mallory": make_user("mallory"),
    }
    use_case = make_use_case(acme, "chatbot", models=(llama,))
    key, _ = make_key(use_case)
    guardrail = GuardrailSelection.objects.create(
        use_case=use_case, guardrail="pii", side="request", action="redact"
    )
    limit = RateLimitPolicy.objects.create(
        name="acme-cap", scope="tenant", tenant=acme, requests_per_minute=600
    )
    event = audit_record(
        actor=Actor.system("tests"), action="tenant.update", obj=acme, tenant_slug="acme"
    )
    return {
        "users": users,
        "acme": acme,
        "llama": llama,
        "use_case": use_case,
        "key": key,
        "guardrail": guardrail,
        "limit": limit,
        "event": event,
        "rule": PriorityRule.objects.first(),
    }


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    url: Callable[[dict[str, Any]], str]
    body: Callable[[dict[str, Any]], dict[str, Any]] | None
    # expected status per persona; alice is acme's own developer, bob the other tenant's
    expect: dict[str, int]


def everyone(status: int, **overrides: int) -> dict[str, int]:
    base = dict.fromkeys(
        ("alice", "bob", "olivia", "audrey", "root", "mallory", "anonymous"), status
    )
    return {**base, "mallory": 403, "anonymous": 401, **overrides}


READ_ALL = everyone(200)


def governed(ok: int, **overrides: int) -> dict[str, int]:
    return everyone(403, olivia=ok, root=ok, **overrides)


TENANT_BODY = {
    "slug": "initech",
    "name": "Initech",
    "business_unit": "BU",
    "application_id": "APP-9",
    "environment": "uat",
    "owner_email": "o@initech.example",
}

CASES = [
    # tenants: developers see their own only
    Case("tenant-list", "get", lambda w: "/api/tenants/", None, READ_ALL),
    Case("tenant-read-acme", "get", lambda w: "/api/tenants/acme/", None, everyone(200, bob=404)),
    Case("tenant-create", "post", lambda w: "/api/tenants/", lambda w: TENANT_BODY, governed(201)),
    Case(
        "tenant-update-acme",
        "patch",
        lambda w: "/api/tenants/acme/",
        lambda w: {"name": "ACME"},
        governed(200, bob=404),
    ),
    # the model catalogue and the priority matrix: everyone with a role reads, officers change
    Case("model-list", "get", lambda w: "/api/models/", None, READ_ALL),
    Case(
        "model-create",
        "post",
        lambda w: "/api/models/",
        lambda w: {"public_id": "qwen", "capabilities": ["chat"]},
        governed(201),
    ),
    Case("model-delete", "delete", lambda w: "/api/models/llama/", None, governed(204)),
    Case(
        "deployment-create",
        "post",
        lambda w: "/api/deployments/",
        lambda w: {
            "model": "llama",
            "served_name": "llama-b",
            "replicas": ["http://10.0.0.5:8000"],
        },
        governed(201),
    ),
    Case(
        "priority-rule-update",
        "patch",
        lambda w: f"/api/priority-rules/{w['rule'].pk}/",
        lambda w: {"priority_class": "low"},
        governed(200),
    ),
    Case("priority-class-list", "get", lambda w: "/api/priority-classes/", None, READ_ALL),
    # rate limits: tenant-scoped ones are the tenant's business
    Case(
        "limit-read-acme",
        "get",
        lambda w: f"/api/rate-limit-policies/{w['limit'].pk}/",
        None,
        everyone(200, bob=404),
    ),
    Case(
        "limit-update-acme",
        "patch",
        lambda w: f"/api/rate-limit-policies/{w['limit'].pk}/",
        lambda w: {"requests_per_minute": 1},
        governed(200, bob=404),
    ),
    # use cases
    Case("usecase-list", "get", lambda w: "/api/use-cases/", None, READ_ALL),
    Case(
        "usecase-read-acme",
        "get",
        lambda w: f"/api/use-cases/{w['use_case'].pk}/",
        None,
        everyone(200, bob=404),
    ),
    Case(
        "usecase-create-in-acme",
        "post",
        lambda w: "/api/use-cases/",
        lambda w: {"tenant": "acme", "slug": "rag", "name": "RAG", "kind": "rag", "purpose": "p"},
        governed(201, alice=201),
    ),
    Case(
        "usecase-update-approved",
        "patch",
        lambda w: f"/api/use-cases/{w['use_case'].pk}/",
        lambda w: {"purpose": "changed"},
        governed(200, bob=404),
    ),
    Case(
        "usecase-suspend",
        "post",
        lambda w: f"/api/use-cases/{w['use_case'].pk}/suspend/",
        lambda w: {"reason": "incident"},
        governed(200, bob=404),
    ),
    Case(
        "usecase-delete",
        "delete",
        lambda w: f"/api/use-cases/{w['use_case'].pk}/",
        None,
        everyone(405),
    ),
    Case(
        "guardrail-update",
        "patch",
        lambda w: f"/api/guardrail-selections/{w['guardrail'].pk}/",
        lambda w: {"action": "block"},
        governed(200, bob=404),
    ),
    # API keys
    Case("key-list", "get", lambda w: "/api/api-keys/", None, READ_ALL),
    Case(
        "key-read-acme",
        "get",
        lambda w: f"/api/api-keys/{w['key'].pk}/",
        None,
        everyone(200, bob=404),
    ),
    Case(
        "key-request-acme",
        "post",
        lambda w: "/api/api-keys/",
        lambda w: {"use_case": w["use_case"].pk, "name": "batch", "reason": "nightly batch"},
        everyone(201, bob=404, audrey=403),
    ),
    Case(
        "key-approve",
        "post",
        lambda w: f"/api/api-keys/{w['key'].pk}/approve/",
        lambda w: {},
        governed(409, bob=404),
    ),  # the key is already active: officers get a conflict
    Case(
        "key-revoke-acme",
        "post",
        lambda w: f"/api/api-keys/{w['key'].pk}/revoke/",
        lambda w: {"reason": "leaked"},
        everyone(200, bob=404, audrey=403),
    ),
    Case(
        "key-reveal-acme",
        "post",
        lambda w: f"/api/api-keys/{w['key'].pk}/reveal/",
        None,
        everyone(403, bob=404),
    ),  # only the requester may reveal; this key was minted
    # the audit trail
    Case("audit-list", "get", lambda w: "/api/audit-events/", None, READ_ALL),
    Case(
        "audit-read-acme",
        "get",
        lambda w: f"/api/audit-events/{w['event'].sequence}/",
        None,
        everyone(200, bob=404),
    ),
    Case(
        "audit-verify",
        "get",
        lambda w: "/api/audit-events/verify/",
        None,
        everyone(200, alice=403, bob=403),
    ),
    Case(
        "audit-delete",
        "delete",
        lambda w: f"/api/audit-events/{w['event'].sequence}/",
        None,
        everyone(405),
    ),
]

PERSONAS = ("alice", "bob", "olivia", "audrey", "root", "mallory", "anonymous")


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_authorization_matrix(world, case: Case, persona: str) -> None:
    client = APIClient()
    if persona != "anonymous":
        client.force_authenticate(world["users"][persona])
    body = case.body(world) if case.body else None
    response = getattr(client, case.method)(case.url(world), body, format="json")
    assert response.status_code == case.expect[persona], (
        f"{persona} {case.method.upper()} {case.url(world)} → {response.status_code}: "
        f"{getattr(response, 'data', response.content)!r}"
    )


def test_lists_show_developers_only_their_tenants_records(world) -> None:
    bob = APIClient()
    bob.force_authenticate(world["users"]["bob"])
    for url in (
        "/api/tenants/",
        "/api/use-cases/",
        "/api/api-keys/",
        "/api/audit-events/",
        "/api/guardrail-selections/",
    ):
        body = bob.get(url).json()
        slugs = {str(item) for item in body["results"]}
        assert "acme" not in " ".join(slugs), f"{url} leaks acme's records to bob: {body}"
    assert [t["slug"] for t in bob.get("/api/tenants/").json()["results"]] == ["globex"]
    assert bob.get("/api/rate-limit-policies/").json()["results"] == []
