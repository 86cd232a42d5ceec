"""Guardrails through the API: the catalogue, a use case's selections (officers change them),
the failure mode, and the findings, scoped by role.

olivia is an officer, audrey an auditor, alice a developer of acme, bob of globex.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from rest_framework.test import APIClient

from governance.models import AuditEvent, GuardrailSelection
from governance.roles import Role
from records.models import GuardrailFinding, GuardrailHour
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("company_guardrails")]


@pytest.fixture
def world():
    acme, globex = make_tenant("acme"), make_tenant("globex")
    llama = make_model("llama")
    make_model("guard-1b", capabilities=["guard"])
    users = {
        "olivia": make_user("olivia", Role.OFFICER),
        "audrey": make_user("audrey", Role.AUDITOR),
        "alice": make_user("alice", Role.DEVELOPER, tenants=(acme,)),
        "bob": make_user("bob", Role.DEVELOPER, tenants=(globex,)),
    }
    clients = {}
    for name, user in users.items():
        clients[name] = APIClient()
        clients[name].force_authenticate(user)
    return {
        **clients,
        "chatbot": make_use_case(acme, "chatbot", models=(llama,)),
        "search": make_use_case(globex, "search", models=(llama,)),
    }


def test_the_catalogue_lists_stages_modes_and_the_model_a_fleet_guardrail_needs(world) -> None:
    response = world["alice"].get("/api/guardrails/catalogue/")
    assert response.status_code == 200
    by_name = {item["name"]: item for item in response.json()}
    assert by_name["wordlist"]["stages"] == ["request", "response"]
    assert by_name["wordlist"]["modes"] == ["block", "redact", "flag"]
    assert by_name["prompt_length"]["stages"] == ["request"]
    assert by_name["prompt_length"]["modes"] == ["block", "flag"]
    assert by_name["banned_topics"]["runs_on"] == "fleet"
    assert by_name["banned_topics"]["model_capability"] == "guard"
    assert by_name["groundedness"]["model_capability"] == "embeddings"


def test_an_officer_selects_orders_and_removes_guardrails_under_the_use_case(world) -> None:
    url = f"/api/use-cases/{world['chatbot'].pk}/guardrails/"
    words = world["olivia"].post(
        url,
        {"guardrail": "wordlist", "side": "both", "action": "redact", "config": {"words": ["x"]}},
        format="json",
    )
    assert words.status_code == 201, words.json()
    assert words.json()["config"] == {"words": ["x"], "case_sensitive": False}
    length = world["olivia"].post(
        url, {"guardrail": "prompt_length", "side": "request", "action": "block"}, format="json"
    )
    assert length.status_code == 201, length.json()
    assert length.json()["position"] == 1

    reordered = world["olivia"].post(
        f"{url}reorder/", {"order": [length.json()["id"], words.json()["id"]]}, format="json"
    )
    assert reordered.status_code == 200, reordered.json()
    listed = world["alice"].get(url).json()
    assert [(g["guardrail"], g["position"]) for g in listed] == [
        ("prompt_length", 0),
        ("wordlist", 1),
    ]

    changed = world["olivia"].patch(
        f"/api/guardrail-selections/{words.json()['id']}/", {"action": "flag"}, format="json"
    )
    assert changed.status_code == 200, changed.json()
    removed = world["olivia"].delete(f"/api/guardrail-selections/{length.json()['id']}/")
    assert removed.status_code == 204
    assert list(GuardrailSelection.objects.values_list("guardrail", "action", "position")) == [
        ("wordlist", "flag", 0)
    ]
    assert set(AuditEvent.objects.values_list("action", flat=True)) >= {
        "guardrailselection.create",
        "usecase.guardrails_reorder",
        "guardrailselection.update",
        "guardrailselection.delete",
    }


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"guardrail": "nope", "side": "request", "action": "block"}, "guardrail", "Unknown"),
        ({"guardrail": "wordlist", "side": "up", "action": "block"}, "side", "valid choice"),
        ({"guardrail": "prompt_length", "side": "request", "action": "redact"}, "action", "redact"),
        (
            {"guardrail": "wordlist", "side": "request", "action": "flag", "config": {"words": 1}},
            "config",
            "words: give a non-empty list",
        ),
        (
            {"guardrail": "banned_topics", "side": "request", "action": "block", "config": {}},
            "config",
            "name the guard model",
        ),
        (
            {
                "guardrail": "wordlist",
                "side": "request",
                "action": "flag",
                "config": {"words": ["x"]},
                "position": 3,
            },
            "position",
            "Choose a position from 0 to 0",
        ),
    ],
)
def test_a_bad_selection_is_a_400_naming_the_field(world, body, field, words) -> None:
    response = world["olivia"].post(
        f"/api/use-cases/{world['chatbot'].pk}/guardrails/", body, format="json"
    )
    assert response.status_code == 400
    assert words in " ".join(response.json()[field])
    assert not GuardrailSelection.objects.exists()


def test_developers_and_auditors_read_guardrails_but_do_not_change_them(world) -> None:
    url = f"/api/use-cases/{world['chatbot'].pk}/guardrails/"
    body = {"guardrail": "prompt_length", "side": "request", "action": "block"}
    assert world["alice"].post(url, body, format="json").status_code == 403
    assert world["audrey"].post(url, body, format="json").status_code == 403
    assert world["bob"].get(url).status_code == 404  # another tenant's use case
    assert world["audrey"].get(url).status_code == 200
    failure = world["alice"].patch(
        f"/api/use-cases/{world['chatbot'].pk}/", {"guardrail_failure": "open"}, format="json"
    )
    assert failure.status_code == 403
    failure = world["olivia"].patch(
        f"/api/use-cases/{world['chatbot'].pk}/", {"guardrail_failure": "open"}, format="json"
    )
    assert failure.status_code == 200
    assert failure.json()["guardrail_failure"] == "open"
    bad = world["olivia"].patch(
        f"/api/use-cases/{world['chatbot'].pk}/", {"guardrail_failure": "ajar"}, format="json"
    )
    assert bad.status_code == 400
    assert "guardrail_failure" in bad.json()


def _finding(use_case, request_id, guardrail, action, at, **extra) -> GuardrailFinding:
    return GuardrailFinding.objects.create(
        stream_id=f"{at.timestamp():.0f}-{request_id}",
        request_id=request_id,
        occurred_at=at,
        tenant=use_case.tenant.slug,
        tenant_id=use_case.tenant_id,
        use_case_id=use_case.pk,
        model="llama",
        stage=extra.pop("stage", "request"),
        guardrail=guardrail,
        action=action,
        entities=extra.pop("entities", {"EMAIL_ADDRESS": 1}),
        score=0.9,
        policy_version=3,
    )


def test_findings_are_scoped_by_role_and_filtered(world) -> None:
    at = datetime(2025, 3, 4, 14, 2, tzinfo=UTC)
    later = datetime(2025, 3, 5, 9, 0, tzinfo=UTC)
    _finding(world["chatbot"], "acme-1", "pii", "redacted", at)
    _finding(world["chatbot"], "acme-2", "prompt_injection", "blocked", later)
    _finding(world["search"], "globex-1", "pii", "flagged", at)

    def ids(who: str, query: str = "") -> set[str]:
        response = world[who].get(f"/api/guardrail-findings/{query}")
        assert response.status_code == 200, response.json()
        return {row["request_id"] for row in response.json()["results"]}

    everything = {"acme-1", "acme-2", "globex-1"}
    assert ids("olivia") == ids("audrey") == everything
    assert ids("alice") == {"acme-1", "acme-2"}
    assert ids("bob") == {"globex-1"}
    assert ids("olivia", "?guardrail=pii") == {"acme-1", "globex-1"}
    assert ids("olivia", "?action=blocked") == {"acme-2"}
    assert ids("olivia", f"?use_case_id={world['search'].pk}") == {"globex-1"}
    assert ids("olivia", "?occurred_at__gte=2025-03-05T00:00:00Z") == {"acme-2"}
    row = world["audrey"].get("/api/guardrail-findings/?request_id=acme-1").json()["results"][0]
    assert row["entities"] == {"EMAIL_ADDRESS": 1}
    bad = world["olivia"].get("/api/guardrail-findings/?occurred_at__gte=yesterday")
    assert bad.status_code == 400


def test_counts_come_from_the_hourly_roll_up_in_scope(world) -> None:
    hour = datetime(2025, 3, 4, 14, tzinfo=UTC)
    for use_case, guardrail, action, n in [
        (world["chatbot"], "pii", "redacted", 5),
        (world["chatbot"], "pii", "blocked", 1),
        (world["search"], "pii", "redacted", 7),
    ]:
        GuardrailHour.objects.create(
            use_case_id=use_case.pk,
            tenant_id=use_case.tenant_id,
            tenant=use_case.tenant.slug,
            guardrail=guardrail,
            action=action,
            hour=hour,
            findings=n,
        )
    counts = world["audrey"].get("/api/guardrail-findings/counts/").json()
    assert counts == [
        {"guardrail": "pii", "action": "blocked", "findings": 1},
        {"guardrail": "pii", "action": "redacted", "findings": 12},
    ]
    assert world["alice"].get("/api/guardrail-findings/counts/").json() == [
        {"guardrail": "pii", "action": "blocked", "findings": 1},
        {"guardrail": "pii", "action": "redacted", "findings": 5},
    ]
    assert (
        world["olivia"].get("/api/guardrail-findings/counts/?since=2025-03-05T00:00:00Z").json()
        == []
    )
    assert world["olivia"].get("/api/guardrail-findings/counts/?since=soon").status_code == 400


def test_one_selection_under_its_use_case_is_read_changed_and_removed(world) -> None:
    url = f"/api/use-cases/{world['chatbot'].pk}/guardrails/"
    created = world["olivia"].post(
        url, {"guardrail": "prompt_length", "side": "request", "action": "block"}, format="json"
    )
    one = f"{url}{created.json()['id']}/"

    assert world["alice"].get(one).json()["config"] == {"max_chars": 4000}
    assert world["alice"].patch(one, {"action": "flag"}, format="json").status_code == 403
    bad = world["olivia"].patch(one, {"config": {"max_chars": -1}}, format="json")
    assert bad.status_code == 400
    assert "max_chars" in bad.json()["config"][0]
    changed = world["olivia"].patch(one, {"config": {"max_chars": 99}}, format="json")
    assert changed.status_code == 200, changed.json()
    assert changed.json()["config"] == {"max_chars": 99}
    # Another use case's selection is not found under this one.
    elsewhere = f"/api/use-cases/{world['search'].pk}/guardrails/{created.json()['id']}/"
    assert world["olivia"].get(elsewhere).status_code == 404
    assert world["olivia"].delete(one).status_code == 204
    assert world["olivia"].get(one).status_code == 404
    assert not GuardrailSelection.objects.exists()
