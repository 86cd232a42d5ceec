"""/api/admission-decisions/: read-only, tenant-scoped, and the auditor's way from a refused
request to its audit summary."""

from __future__ import annotations

from typing import Any

import pytest
import valkey
from rest_framework.test import APIClient

from governance.audit import audit_verify
from governance.roles import Role
from records.models import AdmissionDecision
from records.usage import REFUSAL_ACTION, usage_persist
from testkit.factories import make_tenant, make_user
from tests.records.test_usage import AT_1402, add_decision, ms

pytestmark = pytest.mark.django_db

TPM = "rate_limit:tenant acme tokens per minute"


@pytest.fixture
def world(valkey_client: valkey.Valkey) -> dict[str, Any]:
    acme, globex = make_tenant("acme"), make_tenant("globex")
    users = {
        "alice": make_user("alice", Role.DEVELOPER, tenants=(acme,)),
        "bob": make_user("bob", Role.DEVELOPER, tenants=(globex,)),
        "olivia": make_user("olivia", Role.OFFICER),
        "audrey": make_user("audrey", Role.AUDITOR),
        "root": make_user("root", Role.ADMIN),
        "mallory": make_user("mallory"),
    }
    # What the gateway wrote: acme refused at 14:02 and 14:05, a queue wait, globex refused
    add_decision(valkey_client, request_id="req-1402", reason=TPM, at_ms=ms(AT_1402, 10))
    add_decision(valkey_client, request_id="req-1402b", reason=TPM, at_ms=ms(AT_1402, 20))
    add_decision(valkey_client, request_id="req-1405", reason=TPM, at_ms=ms(AT_1402, 180))
    add_decision(valkey_client, request_id="req-wait", decision="queued", reason="", wait_ms=300)
    add_decision(
        valkey_client,
        request_id="req-globex",
        tenant="globex",
        use_case_id=9,
        decision="shed",
        reason="queue_timeout",
    )
    usage_persist(client=valkey_client, consumer="w1")
    return {"users": users}


def client_for(world: dict[str, Any], persona: str) -> APIClient:
    client = APIClient()
    if persona != "anonymous":
        client.force_authenticate(world["users"][persona])
    return client


def request_ids(response: Any) -> set[str]:
    assert response.status_code == 200, response.data
    return {row["request_id"] for row in response.data["results"]}


ALL = {"req-1402", "req-1402b", "req-1405", "req-wait", "req-globex"}


@pytest.mark.parametrize(
    ("persona", "status", "visible"),
    [
        ("audrey", 200, ALL),
        ("olivia", 200, ALL),
        ("root", 200, ALL),
        ("alice", 200, ALL - {"req-globex"}),
        ("bob", 200, {"req-globex"}),
        ("mallory", 403, None),
        ("anonymous", 401, None),
    ],
)
def test_the_listing_is_tenant_scoped_and_auditor_visible(
    world, persona: str, status: int, visible: set[str] | None
) -> None:
    response = client_for(world, persona).get("/api/admission-decisions/")
    assert response.status_code == status
    if visible is not None:
        assert request_ids(response) == visible


def test_another_tenants_decision_is_not_found_and_nothing_can_be_written(world) -> None:
    acme_row = AdmissionDecision.objects.get(request_id="req-1402")
    url = f"/api/admission-decisions/{acme_row.pk}/"
    assert client_for(world, "bob").get(url).status_code == 404
    assert client_for(world, "alice").get(url).status_code == 200
    root = client_for(world, "root")
    assert root.delete(url).status_code == 405
    assert root.patch(url, {"reason": "x"}, format="json").status_code == 405
    assert root.post("/api/admission-decisions/", {}, format="json").status_code == 405
    assert AdmissionDecision.objects.get(pk=acme_row.pk).reason == TPM


def test_why_was_this_request_refused_at_1402(world) -> None:
    audrey = client_for(world, "audrey")

    # By request id …
    (row,) = audrey.get("/api/admission-decisions/", {"request_id": "req-1402"}).data["results"]
    assert (row["decision"], row["reason"], row["policy_version"]) == ("rejected", TPM, 3)
    assert (row["tenant"], row["use_case_id"], row["model"]) == ("acme", 7, "llama-test")
    assert row["occurred_at"] == "2025-03-04T14:02:15Z"

    # … or by use case and a time range
    in_1402 = audrey.get(
        "/api/admission-decisions/",
        {
            "use_case_id": "7",
            "decision": "rejected",
            "occurred_at__gte": "2025-03-04T14:02:00Z",
            "occurred_at__lt": "2025-03-04T14:03:00Z",
        },
    )
    assert request_ids(in_1402) == {"req-1402", "req-1402b"}
    by_reason = audrey.get("/api/admission-decisions/", {"reason__startswith": "rate_limit:"})
    assert request_ids(by_reason) == {"req-1402", "req-1402b", "req-1405"}

    # … then on to the audit summary of its minute, in the hash-chained trail
    assert row["audit_event"].endswith(f"/api/audit-events/{row['audit_sequence']}/")
    event = audrey.get(row["audit_event"])
    assert event.status_code == 200
    assert event.data["action"] == REFUSAL_ACTION
    assert event.data["after"]["request_ids"] == ["req-1402", "req-1402b"]
    assert event.data["after"]["minute"] == "2025-03-04T14:02:00+00:00"
    assert audit_verify().ok

    # … and back: every decision the summary covers
    covered = audrey.get("/api/admission-decisions/", {"audit_sequence": row["audit_sequence"]})
    assert request_ids(covered) == {"req-1402", "req-1402b"}

    # The use case's refusal summaries are in its audit history, for the auditor …
    history = audrey.get(
        "/api/audit-events/",
        {"object_type": "governance.usecase", "object_id": "7", "action": REFUSAL_ACTION},
    )
    assert [e["after"]["count"] for e in history.data["results"]] == [2, 1]

    # … and for acme's developer, but not for another tenant's
    assert client_for(world, "alice").get(row["audit_event"]).status_code == 200
    assert client_for(world, "bob").get(row["audit_event"]).status_code == 404


def test_a_queue_wait_has_no_audit_event(world) -> None:
    audrey = client_for(world, "audrey")
    (row,) = audrey.get("/api/admission-decisions/", {"decision": "queued"}).data["results"]
    assert (row["request_id"], row["queued_ms"]) == ("req-wait", 300)
    assert (row["audit_sequence"], row["audit_event"]) == (None, None)
