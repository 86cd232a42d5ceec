"""Who may read and change what through /api/: every role × endpoint × own/other tenant.

alice develops for acme; bob for globex (so acme's records are "other tenant" to him);
olivia is an officer, audrey an auditor, root an admin, mallory has no role. Objects outside
a person's scope are 404 (their existence does not leak), actions beyond their role 403.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from rest_framework.test import APIClient

from governance.audit import Actor, audit_record
from governance.models import (
    GuardrailSelection,
    PriorityClass,
    PriorityRule,
    RateLimitPolicy,
    SlaClass,
)
from governance.roles import Role
from testkit.factories import make_key, make_model, make_tenant, make_use_case, make_user
from testkit.records import make_record

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(company_guardrails) -> dict[str, Any]:
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
        use_case=use_case,
        guardrail="wordlist",
        side="request",
        action="redact",
        config={"words": ["falcon"], "case_sensitive": False},
    )
    limit = RateLimitPolicy.objects.create(
        name="acme-cap", scope="tenant", tenant=acme, requests_per_minute=600
    )
    event = audit_record(
        actor=Actor.system("tests"), action="tenant.update", obj=acme, tenant_slug="acme"
    )
    # Records: chatbot keeps its records from developers; faq opens them to its tenant's.
    faq = make_use_case(acme, "faq", records_visible_to_developers=True)
    return {
        "record": make_record(use_case, key_id=key.pk),
        "open_record": make_record(faq),
        "users": users,
        "acme": acme,
        "llama": llama,
        "use_case": use_case,
        "key": key,
        "guardrail": guardrail,
        "limit": limit,
        "event": event,
        "rule": PriorityRule.objects.first(),
        "sla": SlaClass.objects.create(
            use_case=use_case,
            name="interactive",
            turnaround_seconds=300,
            priority_class=PriorityClass.objects.get(name="standard"),
            kinds=["audio"],
        ),
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
    # deployments hold the fleet's internal addresses: officers and admins only
    Case("deployment-list", "get", lambda w: "/api/deployments/", None, governed(200)),
    Case(
        "deployment-read",
        "get",
        lambda w: f"/api/deployments/{w['llama'].deployments.get().pk}/",
        None,
        governed(200),
    ),
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
        governed(201, alice=201, bob=400),
    ),  # bob is told acme does not exist, as for a slug no one has (see below)
    Case(
        "usecase-create-with-namespace",
        "post",
        lambda w: "/api/use-cases/",
        lambda w: {
            "tenant": "acme",
            "slug": "rag",
            "name": "RAG",
            "kind": "rag",
            "purpose": "p",
            "namespace": "prod",
        },
        governed(201, bob=400),
    ),  # the namespace decides priority: officers only
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
        everyone(201, bob=400, audrey=403),
    ),  # bob is told the use case does not exist, as for an id no one has (see below)
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
    # SLA classes: the tenant's developers and auditors read, officers and admins change
    Case("sla-list", "get", lambda w: "/api/sla-classes/", None, READ_ALL),
    Case(
        "sla-read-acme",
        "get",
        lambda w: f"/api/sla-classes/{w['sla'].pk}/",
        None,
        everyone(200, bob=404),
    ),
    Case(
        "sla-create-acme",
        "post",
        lambda w: "/api/sla-classes/",
        lambda w: {
            "use_case": w["use_case"].pk,
            "name": "overnight",
            "windows": [{"days": ["mon"], "start": "20:00", "end": "06:00"}],
            "time_zone": "Europe/Zurich",
            "priority_class": "batch",
            "kinds": ["pdf"],
        },
        governed(201, bob=400),
    ),  # bob is told there is no such use case, as for one no one has
    Case(
        "sla-update-acme",
        "patch",
        lambda w: f"/api/sla-classes/{w['sla'].pk}/",
        lambda w: {"turnaround_seconds": 600},
        governed(200, bob=404),
    ),
    Case(
        "sla-delete-acme",
        "delete",
        lambda w: f"/api/sla-classes/{w['sla'].pk}/",
        None,
        governed(204, bob=404),
    ),
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
    Case("audit-export", "get", lambda w: "/api/audit/export/", None, governed(200, audrey=200)),
    # interaction records: auditors, officers and admins read all; a developer reads their own
    # tenant's, and only of use cases that open their records to developers (faq, not chatbot)
    Case("record-list", "get", lambda w: "/api/records/", None, READ_ALL),
    Case(
        "record-read-open",
        "get",
        lambda w: f"/api/records/{w['open_record'].record_id}/",
        None,
        everyone(200, bob=404),
    ),
    Case(
        "record-read-closed",
        "get",
        lambda w: f"/api/records/{w['record'].record_id}/",
        None,
        everyone(200, alice=404, bob=404),
    ),
    Case("record-export", "get", lambda w: "/api/records/export/", None, READ_ALL),
    Case(
        "record-export-csv",
        "get",
        lambda w: "/api/records/export/?format=csv&tenant=acme",
        None,
        everyone(200, bob=400),
    ),  # bob is told acme is not a valid choice, as for a tenant no one has
    Case(
        "record-delete",
        "delete",
        lambda w: f"/api/records/{w['record'].record_id}/",
        None,
        everyone(405),
    ),
    Case(
        "record-update",
        "patch",
        lambda w: f"/api/records/{w['record'].record_id}/",
        lambda w: {"status": 200},
        everyone(405),
    ),
    Case("record-create", "post", lambda w: "/api/records/", lambda w: {}, everyone(405)),
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
    if response.streaming:
        # Read the export to its end and close it here: a stream left open audits its end
        # (``records.exported``) whenever it is collected, which is inside a later test.
        b"".join(response.streaming_content)
        response.close()
    assert response.status_code == case.expect[persona], (
        f"{persona} {case.method.upper()} {case.url(world)} → {response.status_code}: "
        f"{getattr(response, 'data', response.content)!r}"
    )


def test_lists_show_developers_only_their_tenants_records_by_id(world) -> None:
    """Every list bob reads holds globex's records and none of acme's, compared by id."""
    globex = make_tenant("globex2")
    bob_user = world["users"]["bob"]
    globex.members.add(bob_user)
    search = make_use_case(globex, "search", models=(world["llama"],))
    bob_key, _ = make_key(search)
    bob_guardrail = GuardrailSelection.objects.create(
        use_case=search, guardrail="pii", side="response", action="flag"
    )
    bob_event = audit_record(
        actor=Actor.system("tests"), action="tenant.update", obj=globex, tenant_slug="globex2"
    )
    acme_ids = {
        "/api/tenants/": ("slug", "acme"),
        "/api/use-cases/": ("id", world["use_case"].pk),
        "/api/api-keys/": ("id", world["key"].pk),
        "/api/audit-events/": ("sequence", world["event"].sequence),
        "/api/guardrail-selections/": ("id", world["guardrail"].pk),
        "/api/rate-limit-policies/": ("id", world["limit"].pk),
        "/api/sla-classes/": ("id", world["sla"].pk),
    }
    own_ids = {
        "/api/tenants/": "globex2",
        "/api/use-cases/": search.pk,
        "/api/api-keys/": bob_key.pk,
        "/api/audit-events/": bob_event.sequence,
        "/api/guardrail-selections/": bob_guardrail.pk,
    }
    bob = APIClient()
    bob.force_authenticate(bob_user)
    for url, (field, acme_id) in acme_ids.items():
        seen = [item[field] for item in bob.get(url).json()["results"]]
        assert acme_id not in seen, f"{url} shows bob acme's record {field}={acme_id}"
        if url in own_ids:
            assert own_ids[url] in seen, f"{url} hides bob's own record: {seen}"
    # ...and the same lists do show acme's records to alice, so the ids are the right ones.
    alice = APIClient()
    alice.force_authenticate(world["users"]["alice"])
    for url, (field, acme_id) in acme_ids.items():
        assert acme_id in [item[field] for item in alice.get(url).json()["results"]], url


def _scrub(body: Any, value: str) -> str:
    return repr(body).replace(value, "<value>")


def test_a_foreign_tenant_and_an_unknown_one_get_the_same_answer(world) -> None:
    """GIVEN bob of globex WHEN he creates a use case in acme, and in a tenant no one has
    THEN both answers are the same status and words: acme's existence does not leak."""
    bob = APIClient()
    bob.force_authenticate(world["users"]["bob"])
    body = {"slug": "rag", "name": "RAG", "kind": "rag", "purpose": "p"}
    foreign = bob.post("/api/use-cases/", {**body, "tenant": "acme"}, format="json")
    unknown = bob.post("/api/use-cases/", {**body, "tenant": "nosuch"}, format="json")
    assert foreign.status_code == unknown.status_code == 400
    assert _scrub(foreign.json(), "acme") == _scrub(unknown.json(), "nosuch")
    assert "acme" not in repr(foreign.json())


def test_a_foreign_use_case_and_an_unknown_one_get_the_same_answer(world) -> None:
    bob = APIClient()
    bob.force_authenticate(world["users"]["bob"])
    foreign_id, unknown_id = world["use_case"].pk, world["use_case"].pk + 1000
    body = {"name": "batch", "reason": "nightly"}
    foreign = bob.post("/api/api-keys/", {**body, "use_case": foreign_id}, format="json")
    unknown = bob.post("/api/api-keys/", {**body, "use_case": unknown_id}, format="json")
    assert foreign.status_code == unknown.status_code
    assert foreign.status_code in (400, 404)
    assert _scrub(foreign.json(), str(foreign_id)) == _scrub(unknown.json(), str(unknown_id))


def test_developers_read_model_names_but_no_replica_address(world) -> None:
    url = world["llama"].deployments.get().replicas[0]
    alice = APIClient()
    alice.force_authenticate(world["users"]["alice"])
    models = alice.get("/api/models/")
    assert models.status_code == 200
    assert [m["public_id"] for m in models.json()["results"]] == ["llama"]
    assert url not in models.content.decode()
    assert url not in alice.get("/api/models/llama/").content.decode()
    olivia = APIClient()
    olivia.force_authenticate(world["users"]["olivia"])
    assert url in olivia.get("/api/deployments/").content.decode()


def test_developers_may_not_set_a_use_cases_namespace(world) -> None:
    alice = APIClient()
    alice.force_authenticate(world["users"]["alice"])
    body = {"tenant": "acme", "slug": "rag", "name": "RAG", "kind": "rag", "purpose": "p"}
    refused = alice.post("/api/use-cases/", {**body, "namespace": "prod"}, format="json")
    assert refused.status_code == 403, refused.json()
    assert "Only an officer may set namespace." in refused.json()["detail"]
    draft = alice.post("/api/use-cases/", body, format="json")
    assert draft.status_code == 201, draft.json()
    assert draft.json()["namespace"] == "dev"
    patch = alice.patch(f"/api/use-cases/{draft.json()['id']}/", {"namespace": "prod-dr"})
    assert patch.status_code == 403, patch.json()
    # Sending back the value it already has changes nothing and is not refused.
    same = alice.patch(f"/api/use-cases/{draft.json()['id']}/", {"namespace": "dev", "name": "R"})
    assert same.status_code == 200, same.json()
    olivia = APIClient()
    olivia.force_authenticate(world["users"]["olivia"])
    moved = olivia.patch(f"/api/use-cases/{draft.json()['id']}/", {"namespace": "prod"})
    assert moved.status_code == 200
    assert moved.json()["namespace"] == "prod"


@pytest.mark.parametrize(
    "url", ["/api/api-keys/", "/api/guardrail-selections/", "/api/sla-classes/"]
)
def test_filtering_by_a_foreign_use_case_answers_as_for_an_unknown_one(world, url: str) -> None:
    bob = APIClient()
    bob.force_authenticate(world["users"]["bob"])
    foreign_id, unknown_id = world["use_case"].pk, world["use_case"].pk + 1000
    foreign = bob.get(url, {"use_case": foreign_id})
    unknown = bob.get(url, {"use_case": unknown_id})
    assert foreign.status_code == unknown.status_code
    assert _scrub(foreign.json(), str(foreign_id)) == _scrub(unknown.json(), str(unknown_id))


@pytest.mark.parametrize(
    ("persona", "sees"),
    [
        ("alice", {"open_record"}),
        ("bob", set()),
        ("audrey", {"record", "open_record"}),
        ("olivia", {"record", "open_record"}),
    ],
)
def test_record_lists_and_exports_hold_only_what_each_persona_may_read(
    world, persona: str, sees: set[str]
) -> None:
    client = APIClient()
    client.force_authenticate(world["users"][persona])
    expected = {world[name].record_id for name in sees}
    listed = {item["record_id"] for item in client.get("/api/records/").json()["results"]}
    assert listed == expected
    response: Any = client.get("/api/records/export/")
    exported = b"".join(response.streaming_content)
    assert {orjson.loads(line)["record_id"] for line in exported.splitlines()} == expected


def test_a_foreign_use_case_filter_on_records_answers_as_for_an_unknown_one(world) -> None:
    bob = APIClient()
    bob.force_authenticate(world["users"]["bob"])
    foreign_id, unknown_id = world["use_case"].pk, world["use_case"].pk + 1000
    foreign = bob.get("/api/records/", {"use_case": foreign_id})
    unknown = bob.get("/api/records/", {"use_case": unknown_id})
    assert foreign.status_code == unknown.status_code == 400
    assert _scrub(foreign.json(), str(foreign_id)) == _scrub(unknown.json(), str(unknown_id))
