"""Binding a Keycloak client to a use case: one client, one use case; officers decide; every
door (services, API, admin, policy as code) says the same and audits the change.

olivia is the governance officer, alice a developer of acme; priya's CI applies the policy.
"""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest
from django.contrib import admin
from django.core.exceptions import PermissionDenied, ValidationError
from django.test import RequestFactory
from rest_framework.test import APIClient

from gateway.policy import SNAPSHOT_KEY, parse_snapshot
from governance.audit import Actor, audit_verify
from governance.choices import UseCaseStatus
from governance.models import SERVICE_ACCOUNT_TAKEN, AuditEvent, UseCase
from governance.policy_as_code.apply import policy_apply
from governance.policy_as_code.errors import PolicyInvalid
from governance.policy_as_code.export import policy_export
from governance.policy_as_code.plan import plan_build
from governance.policy_as_code.schema import policy_load, policy_parse
from governance.policy_as_code.selectors import policy_current
from governance.roles import Role
from governance.services.use_cases import use_case_update
from testkit.factories import make_model, make_tenant, make_use_case, make_user
from tests.governance.test_policy_as_code_validation import acme_policy

# acme_policy selects a company's own guardrail (testkit/detectors.py).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("company_guardrails")]

WORKER = "acme-chatbot-worker"
PRIYA = Actor(username="priya", is_system=True)  # --actor priya


@pytest.fixture
def acme() -> dict[str, Any]:
    tenant = make_tenant("acme")
    llama = make_model("llama")
    olivia = make_user("olivia", Role.OFFICER)
    alice = make_user("alice", Role.DEVELOPER, tenants=(tenant,))
    return {
        "chatbot": make_use_case(tenant, "chatbot", models=(llama,)),
        "search": make_use_case(tenant, "search", models=(llama,)),
        "olivia": Actor.for_user(olivia),
        "alice": Actor.for_user(alice),
        "olivia_api": _api(olivia),
        "alice_api": _api(alice),
    }


def _api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


# --- the services -----------------------------------------------------------------------------
def test_an_officer_binds_a_client_and_the_change_is_audited(acme) -> None:
    use_case_update(
        actor=acme["olivia"],
        use_case=acme["chatbot"],
        changes={"service_account_client_id": WORKER},
    )

    assert UseCase.objects.get(pk=acme["chatbot"].pk).service_account_client_id == WORKER
    event = AuditEvent.objects.filter(action="usecase.update").latest("sequence")
    assert event.actor == "olivia"
    assert event.before is not None
    assert event.after is not None
    assert event.before["service_account_client_id"] == ""
    assert event.after["service_account_client_id"] == WORKER
    assert audit_verify().ok


def test_a_second_use_case_cannot_take_a_bound_client_and_is_told_why_on_the_field(acme) -> None:
    bind = {"service_account_client_id": WORKER}
    use_case_update(actor=acme["olivia"], use_case=acme["chatbot"], changes=bind)

    with pytest.raises(ValidationError) as refused:
        use_case_update(actor=acme["olivia"], use_case=acme["search"], changes=bind)

    assert refused.value.message_dict == {"service_account_client_id": [SERVICE_ACCOUNT_TAKEN]}
    # Many use cases without a client are fine: only a set value is unique.
    assert UseCase.objects.filter(service_account_client_id="").count() == 1


def test_a_malformed_client_id_is_refused_on_the_field(acme) -> None:
    with pytest.raises(ValidationError) as refused:
        use_case_update(
            actor=acme["olivia"],
            use_case=acme["chatbot"],
            changes={"service_account_client_id": "two words"},
        )
    assert (
        "Use the Keycloak client id" in refused.value.message_dict["service_account_client_id"][0]
    )


def test_a_developer_cannot_bind_a_client_even_on_a_draft(acme) -> None:
    draft = make_use_case(acme["chatbot"].tenant, "draft", status=UseCaseStatus.DRAFT)
    with pytest.raises(PermissionDenied, match="Only an officer may set service_account_client_id"):
        use_case_update(
            actor=acme["alice"], use_case=draft, changes={"service_account_client_id": WORKER}
        )


# --- the API and the admin --------------------------------------------------------------------
def test_the_api_shows_and_sets_the_binding_with_the_same_message(acme) -> None:
    olivia = acme["olivia_api"]
    chatbot, search = acme["chatbot"], acme["search"]

    bound = olivia.patch(
        f"/api/use-cases/{chatbot.pk}/", {"service_account_client_id": WORKER}, format="json"
    )
    assert bound.status_code == 200, bound.data
    assert bound.data["service_account_client_id"] == WORKER

    clash = olivia.patch(
        f"/api/use-cases/{search.pk}/", {"service_account_client_id": WORKER}, format="json"
    )
    assert clash.status_code == 400
    assert clash.data == {"service_account_client_id": [SERVICE_ACCOUNT_TAKEN]}

    forbidden = acme["alice_api"].patch(
        f"/api/use-cases/{search.pk}/", {"service_account_client_id": "other"}, format="json"
    )
    assert forbidden.status_code == 403


def test_the_admin_form_has_the_field_and_refuses_a_taken_client_on_it(acme) -> None:
    UseCase.objects.filter(pk=acme["chatbot"].pk).update(service_account_client_id=WORKER)
    search = acme["search"]
    request = RequestFactory().get("/admin/")
    request.user = cast(Any, make_user("root", Role.ADMIN))
    form_class = admin.site._registry[UseCase].get_form(request, search)
    assert "service_account_client_id" in form_class.base_fields
    data = {
        "tenant": search.tenant_id,
        "slug": search.slug,
        "name": search.name,
        "kind": search.kind,
        "purpose": search.purpose,
        "data_classification": search.data_classification,
        "namespace": search.namespace,
        "allowed_models": [m.pk for m in search.allowed_models.all()],
        "service_account_client_id": WORKER,
    }
    form = form_class(data=data, instance=search)
    assert not form.is_valid()
    assert form.errors["service_account_client_id"] == [SERVICE_ACCOUNT_TAKEN]


# --- policy as code ---------------------------------------------------------------------------
def bound_policy(**bindings: str) -> dict[str, Any]:
    """acme_policy with a second use case, and clients bound as given (slug → client)."""
    data = acme_policy()
    search = copy.deepcopy(data["use_cases"][0])
    search.update(id="acme/search", name="Search", guardrails=[])
    data["use_cases"].append(search)
    for use_case in data["use_cases"]:
        slug = use_case["id"].split("/")[1]
        if slug in bindings:
            use_case["service_account_client_id"] = bindings[slug]
    return data


def test_a_binding_round_trips_through_apply_export_and_the_snapshot(
    live_valkey_settings, valkey_client, django_capture_on_commit_callbacks
) -> None:
    """GIVEN a policy file binding client acme-chatbot-worker to acme/chatbot
    WHEN applied, exported and planned again
    THEN the database and the gateway's snapshot hold the binding, the export writes it, and
    planning the export against the database finds nothing to do."""
    with django_capture_on_commit_callbacks(execute=True):
        policy_apply(document=policy_parse(bound_policy(chatbot=WORKER)), actor=PRIYA)

    chatbot = UseCase.objects.get(slug="chatbot")
    assert chatbot.service_account_client_id == WORKER
    snapshot = parse_snapshot(valkey_client.get(SNAPSHOT_KEY))
    assert snapshot.service_accounts[WORKER].use_case_id == chatbot.pk

    exported = policy_export()
    assert f"service_account_client_id: {WORKER}" in exported
    assert not plan_build(policy_load(exported), policy_current()).has_changes
    assert not plan_build(policy_parse(bound_policy(chatbot=WORKER)), policy_current()).has_changes

    # Unbinding is a plain field change, planned and audited like any other.
    unbound = plan_build(policy_parse(bound_policy()), policy_current())
    [change] = unbound.changes
    assert change.changed() == {"service_account_client_id": ""}
    policy_apply(document=policy_parse(bound_policy()), actor=PRIYA)
    assert UseCase.objects.get(slug="chatbot").service_account_client_id == ""
    assert audit_verify().ok


def test_a_binding_moved_between_two_use_cases_of_the_file_applies_in_one_go() -> None:
    policy_apply(
        document=policy_parse(bound_policy(chatbot=WORKER, search="acme-search")), actor=PRIYA
    )

    policy_apply(
        document=policy_parse(bound_policy(chatbot="acme-search", search=WORKER)), actor=PRIYA
    )

    assert dict(UseCase.objects.values_list("slug", "service_account_client_id")) == {
        "chatbot": "acme-search",
        "search": WORKER,
    }


def test_a_client_bound_twice_in_the_file_is_a_validation_problem() -> None:
    with pytest.raises(PolicyInvalid) as caught:
        policy_parse(bound_policy(chatbot=WORKER, search=WORKER))
    assert [str(p) for p in caught.value.problems] == [
        f"use_cases[acme/search].service_account_client_id: client '{WORKER}' is already bound "
        "to use_cases[acme/chatbot]; a client acts as one use case only"
    ]


def test_a_client_held_by_a_use_case_the_file_does_not_list_is_a_plan_problem() -> None:
    policy_apply(document=policy_parse(bound_policy()), actor=PRIYA)
    tenant = UseCase.objects.get(slug="chatbot").tenant
    make_use_case(tenant, "legacy", service_account_client_id=WORKER)

    with pytest.raises(PolicyInvalid) as caught:
        plan_build(policy_parse(bound_policy(chatbot=WORKER)), policy_current())

    assert [str(p) for p in caught.value.problems] == [
        f"use_cases[acme/chatbot].service_account_client_id: client '{WORKER}' is bound to use "
        "case acme/legacy in the database, which the file does not list; unbind it there first"
    ]
