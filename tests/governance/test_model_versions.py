"""A model's versions, aliases and traffic split on every officer's door (issue 27,
docs/models.md): the API (its 400s name the field, its writes are audited and republished),
the admin, policy as code (round trip, errors at their place, the order apply needs) and the
portal's forms."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import valkey
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from gateway.policy import SNAPSHOT_KEY
from governance.audit import Actor
from governance.models import AuditEvent, Deployment, Model, UseCase
from governance.policy_as_code.apply import policy_apply
from governance.policy_as_code.errors import PolicyApplyFailed, PolicyInvalid
from governance.policy_as_code.export import policy_export
from governance.policy_as_code.plan import plan_build
from governance.policy_as_code.schema import policy_load, policy_parse
from governance.policy_as_code.selectors import policy_current
from governance.roles import Role
from testkit.factories import make_model, make_tenant, make_use_case, make_user
from testkit.officer_plans import applied, changed_fields, reviewed
from tests.governance.test_admin import _use_case_form
from tests.governance.test_policy_as_code_validation import acme_policy

pytestmark = pytest.mark.django_db


@pytest.fixture
def llama() -> Model:
    """llama served as v1 (llama-v1) and v2 (llama-v2), with no routing yet; acme's chatbot
    may call it."""
    model = make_model("llama", capabilities=["chat"])
    Deployment.objects.filter(model=model).update(served_name="llama-v1", version="v1")
    Deployment.objects.create(
        model=model, served_name="llama-v2", replicas=["http://10.0.0.2:8000"], version="v2"
    )
    make_use_case(make_tenant("acme"), "chatbot", models=(model,))
    return model


@pytest.fixture
def officer_api() -> APIClient:
    api = APIClient()
    api.force_authenticate(make_user("olivia", Role.OFFICER))
    return api


CANARY = {"split": {"v1": 95, "v2": 5}, "sticky": "use_case", "aliases": {"stable": "v1"}}


# --- the API ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("routing", "says"),
    [
        ({"split": {"v1": 90, "v3": 10}}, "'v3' is not a version of this model (v1, v2)"),
        ({"aliases": {"v2": "v1"}}, "'v2' is already a version's name"),
        ({"split": {"v1": 0}}, "at least one version a weight above 0"),
        ({"sticky": "forever"}, "'sticky' is one of request, use_case"),
    ],
)
def test_a_routing_the_versions_do_not_allow_is_a_400_naming_routing(
    llama: Model, officer_api: APIClient, routing: dict[str, Any], says: str
) -> None:
    refused = officer_api.patch("/api/models/llama/", {"routing": routing}, format="json")
    assert refused.status_code == 400
    assert set(refused.data) == {"routing"}
    assert says in " ".join(refused.data["routing"])
    assert Model.objects.get(pk=llama.pk).routing == {}
    assert not AuditEvent.objects.exists()


def test_a_routing_change_is_audited_and_republished(
    llama: Model,
    officer_api: APIClient,
    live_valkey_settings: Any,
    valkey_client: valkey.Valkey,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        answer = officer_api.patch("/api/models/llama/", {"routing": CANARY}, format="json")
    assert answer.status_code == 200, answer.data
    assert answer.data["routing"] == CANARY
    assert {d["served_name"]: d["version"] for d in answer.data["deployments"]} == {
        "llama-v1": "v1",
        "llama-v2": "v2",
    }

    update = AuditEvent.objects.get(action="model.update")
    assert update.actor == "olivia"
    assert (update.before or {})["routing"] == {}
    assert (update.after or {})["routing"] == CANARY

    published = orjson.loads(valkey_client.get(SNAPSHOT_KEY))["models"]  # type: ignore[arg-type]
    assert published["llama"]["routing"] == {
        "versions": ["v1", "v2"],
        "split": [["v1", 95], ["v2", 5]],
        "sticky": "use_case",
        "aliases": {"stable": "v1"},
    }
    # The model's entry chooses a version; it lists every replica for gateways from before
    # versions, during an upgrade.
    assert published["llama"]["replicas"] == ["http://127.0.0.1:9", "http://10.0.0.2:8000"]
    assert (published["llama@v1"]["version_of"], published["llama@v1"]["version"]) == (
        "llama",
        "v1",
    )
    assert published["llama@v2"]["replicas"] == ["http://10.0.0.2:8000"]
    assert [d["served_name"] for d in published["llama@v2"]["deployments"]] == ["llama-v2"]


def test_deployments_are_all_labelled_or_none_and_labels_have_a_shape(
    llama: Model, officer_api: APIClient
) -> None:
    body = {"model": "llama", "served_name": "llama-x", "replicas": ["http://10.0.0.3:8000"]}
    unlabelled = officer_api.post("/api/deployments/", body, format="json")
    assert unlabelled.status_code == 400
    assert "on all of this model's active deployments or on none" in str(unlabelled.data["version"])

    for label in ("V 3", "v-3!"):
        badly = officer_api.post("/api/deployments/", {**body, "version": label}, format="json")
        assert badly.status_code == 400, label
        assert "lowercase letters" in str(badly.data["version"])

    labelled = officer_api.post("/api/deployments/", {**body, "version": "v3"}, format="json")
    assert labelled.status_code == 201, labelled.data
    assert labelled.data["version"] == "v3"


def test_the_last_deployment_of_a_routed_version_stays_until_routed_away(
    llama: Model, officer_api: APIClient
) -> None:
    officer_api.patch("/api/models/llama/", {"routing": CANARY}, format="json")
    v2 = Deployment.objects.get(served_name="llama-v2")

    for change in ({"active": False}, {"version": "v3"}):
        refused = officer_api.patch(f"/api/deployments/{v2.pk}/", change, format="json")
        assert refused.status_code == 400
        assert "route it away before" in str(refused.data["version"])
    deleted = officer_api.delete(f"/api/deployments/{v2.pk}/")
    assert deleted.status_code == 400, deleted.content
    assert "route it away before it is deleted" in str(deleted.json())
    assert Deployment.objects.filter(pk=v2.pk).exists()

    moved = officer_api.patch(
        "/api/models/llama/", {"routing": {"split": {"v1": 100}}}, format="json"
    )
    assert moved.status_code == 200, moved.data
    gone = officer_api.patch(f"/api/deployments/{v2.pk}/", {"active": False}, format="json")
    assert gone.status_code == 200, gone.data


def test_a_use_case_is_pinned_to_a_version_or_alias_only(
    llama: Model, officer_api: APIClient
) -> None:
    officer_api.patch("/api/models/llama/", {"routing": CANARY}, format="json")
    chatbot = UseCase.objects.get(slug="chatbot")
    path = f"/api/use-cases/{chatbot.pk}/"

    for pins, says in (
        ({"llama": "v9"}, "'v9' is not one of its versions or aliases"),
        ({"nope": "v1"}, "'nope' is not a model with versions"),
        ({"no such model": "v1"}, "'no such model' is not a model id"),
    ):
        refused = officer_api.patch(path, {"model_pins": pins}, format="json")
        assert refused.status_code == 400
        assert says in " ".join(refused.data["model_pins"])

    pinned = officer_api.patch(path, {"model_pins": {"llama": "stable"}}, format="json")
    assert pinned.status_code == 200, pinned.data
    assert pinned.data["model_pins"] == {"llama": "stable"}
    update = AuditEvent.objects.get(action="usecase.update")
    assert (update.after or {})["model_pins"] == {"llama": "stable"}

    # The routing cannot take away what a use case is pinned to.
    refused = officer_api.patch(
        "/api/models/llama/", {"routing": {"split": {"v1": 100}}}, format="json"
    )
    assert refused.status_code == 400
    assert "is pinned to 'stable'" in " ".join(refused.data["routing"])

    # A developer of the tenant cannot pin: it decides what a use case is served with.
    alice = APIClient()
    alice.force_authenticate(make_user("alice", Role.DEVELOPER, tenants=(chatbot.tenant,)))
    assert alice.patch(path, {"model_pins": {}}, format="json").status_code == 403


# --- the admin -------------------------------------------------------------------------------
def test_the_admin_edits_versions_and_routing(llama: Model) -> None:
    root = make_user("root", Role.ADMIN)
    root.is_staff = root.is_superuser = True
    root.save()
    browser = Client()
    browser.force_login(root)  # type: ignore[arg-type]
    form = {
        "public_id": "llama",
        "description": "",
        "capabilities": '["chat"]',
        "timeout_seconds": "60",
        "max_tokens": "",
        "status": "active",
        "at_sunset": "refuse",
        "notice_url": "",
        "routing": '{"split": {"v1": 50, "v3": 50}}',
        "prices-TOTAL_FORMS": "0",
        "prices-INITIAL_FORMS": "0",
    }
    refused = browser.post(f"/admin/governance/model/{llama.pk}/change/", form)
    assert refused.status_code == 200
    assert "&#x27;v3&#x27; is not a version of this model" in refused.content.decode()

    form["routing"] = '{"split": {"v1": 50, "v2": 50}}'
    saved = browser.post(f"/admin/governance/model/{llama.pk}/change/", form)
    assert saved.status_code == 302, saved.content.decode()[:3000]
    assert Model.objects.get(pk=llama.pk).routing == {"split": {"v1": 50, "v2": 50}}
    assert AuditEvent.objects.filter(action="model.update", actor="root").count() == 1

    chatbot = UseCase.objects.get(slug="chatbot")
    change = f"/admin/governance/usecase/{chatbot.pk}/change/"
    pinned = browser.post(change, {**_use_case_form(chatbot), "model_pins": '{"llama": "v2"}'})
    assert pinned.status_code == 302, pinned.content.decode()[:3000]
    assert UseCase.objects.get(pk=chatbot.pk).model_pins == {"llama": "v2"}
    unpinned = browser.post(change, {**_use_case_form(chatbot), "model_pins": ""})
    assert unpinned.status_code == 302, unpinned.content.decode()[:3000]
    assert UseCase.objects.get(pk=chatbot.pk).model_pins == {}


# --- policy as code --------------------------------------------------------------------------
def versioned_policy() -> dict[str, Any]:
    """acme's policy with llama in two versions, a canary split, an alias and a pin."""
    data = acme_policy()
    llama = data["models"][0]
    llama["deployments"] = [
        {"served_name": "llama-8b", "version": "v1", "replicas": ["http://10.0.0.1:8000"]},
        {"served_name": "llama-8b-new", "version": "v2", "replicas": ["http://10.0.0.2:8000"]},
    ]
    llama["routing"] = {
        "split": {"v1": 95, "v2": 5},
        "sticky": "use_case",
        "aliases": {"stable": "v1", "preview": "v2"},
    }
    data["use_cases"][0]["model_pins"] = {"llama": "preview"}
    return data


@pytest.mark.usefixtures("company_guardrails")
def test_policy_as_code_applies_versions_and_round_trips() -> None:
    priya = Actor(username="priya", is_system=True)
    # The model, its deployments, its routing and the pin all new in one apply: the routing
    # waits for the versions it names.
    policy_apply(document=policy_parse(versioned_policy()), actor=priya)
    llama = Model.objects.get(public_id="llama")
    assert llama.routing == {
        "split": {"v1": 95, "v2": 5},
        "sticky": "use_case",
        "aliases": {"preview": "v2", "stable": "v1"},
    }
    assert llama.versions() == {"v1", "v2"}
    assert UseCase.objects.get(slug="chatbot").model_pins == {"llama": "preview"}
    assert not plan_build(policy_parse(versioned_policy()), policy_current()).has_changes

    exported = policy_export()
    assert "version: v2" in exported
    assert "split: {v1: 95, v2: 5}" in exported
    assert "model_pins: {llama: preview}" in exported
    assert not plan_build(policy_load(exported), policy_current()).has_changes


@pytest.mark.usefixtures("company_guardrails")
def test_policy_as_code_moves_all_traffic_to_a_new_version_in_one_apply() -> None:
    """v1 replaced by v3: the old routing names what goes, the new one what comes, so apply
    routes v1 away before its deployment goes and v3 in once its deployment is there."""
    priya = Actor(username="priya", is_system=True)
    data = versioned_policy()
    data["use_cases"][0]["model_pins"] = {"llama": "stable"}
    policy_apply(document=policy_parse(data), actor=priya)

    llama = data["models"][0]
    llama["deployments"] = [
        {"served_name": "llama-8b", "version": "v1", "replicas": ["http://10.0.0.1:8000"]},
        {"served_name": "llama-8b-v3", "version": "v3", "replicas": ["http://10.0.0.3:8000"]},
    ]
    llama["deployments"][0]["active"] = False
    llama["routing"] = {"split": {"v3": 100}, "aliases": {"stable": "v3"}}
    plan = policy_apply(document=policy_parse(data), actor=priya, prune=True).plan
    assert plan.has_changes
    model = Model.objects.get(public_id="llama")
    assert model.versions() == {"v3"}
    assert model.routing == {"split": {"v3": 100}, "aliases": {"stable": "v3"}}
    assert not plan_build(policy_parse(data), policy_current(), prune=True).has_changes


@pytest.mark.usefixtures("company_guardrails")
def test_policy_as_code_cannot_leave_a_pin_stale_at_its_end() -> None:
    """The routing may pass through steps that drop an alias, but a file whose end state
    takes away what a use case is pinned to is refused whole, naming the pin."""
    priya = Actor(username="priya", is_system=True)
    data = versioned_policy()
    data["use_cases"][0]["model_pins"] = {"llama": "stable"}
    policy_apply(document=policy_parse(data), actor=priya)
    pinned = UseCase.objects.get(slug="chatbot")
    # The file no longer speaks for the use case (nor its keys): without prune, it and its
    # pin stay as they are.
    data["use_cases"], data["keys"] = [], []
    data["models"][0]["routing"] = {"split": {"v1": 100}}

    with pytest.raises(PolicyApplyFailed) as refused:
        policy_apply(document=policy_parse(data), actor=priya)
    assert any(
        problem.path == f"use_cases[{pinned}].model_pins.llama" and "'stable'" in problem.message
        for problem in refused.value.problems
    ), refused.value.problems
    assert Model.objects.get(public_id="llama").routing["aliases"]["stable"] == "v1"  # unchanged


@pytest.mark.usefixtures("company_guardrails")
def test_policy_as_code_goes_back_to_a_model_without_versions() -> None:
    """The routing goes first (it names what goes), the v2 deployment is switched off before
    v1's label is taken off (never both labelled and unlabelled active ones), the pin goes."""
    priya = Actor(username="priya", is_system=True)
    policy_apply(document=policy_parse(versioned_policy()), actor=priya)

    data = versioned_policy()
    llama = data["models"][0]
    del llama["routing"], llama["deployments"][0]["version"], llama["deployments"][1]["version"]
    llama["deployments"][1]["active"] = False
    del data["use_cases"][0]["model_pins"]
    policy_apply(document=policy_parse(data), actor=priya)
    model = Model.objects.get(public_id="llama")
    assert (model.routing, model.versions()) == ({}, set())
    assert UseCase.objects.get(slug="chatbot").model_pins == {}
    assert not plan_build(policy_parse(data), policy_current()).has_changes


@pytest.mark.usefixtures("company_guardrails")
def test_policy_as_code_names_unknown_versions_and_pins_at_their_place() -> None:
    data = versioned_policy()
    data["models"][0]["routing"]["split"]["v3"] = 1
    data["models"][0]["deployments"].append(
        {"served_name": "llama-plain", "replicas": ["http://10.0.0.4:8000"]}
    )
    data["use_cases"][0]["model_pins"] = {"llama": "nightly"}
    with pytest.raises(PolicyInvalid) as refused:
        policy_parse(data)
    problems = {str(problem) for problem in refused.value.problems}
    assert any(
        p.startswith("models[llama].routing") and "'v3' is not a version" in p for p in problems
    ), problems
    assert any(p.startswith("models[llama].deployments[llama-plain].version") for p in problems), (
        problems
    )
    assert any(
        p.startswith("use_cases[acme/chatbot].model_pins.llama") and "'nightly'" in p
        for p in problems
    ), problems


# --- the portal ------------------------------------------------------------------------------


def test_an_officer_sets_the_routing_and_a_pin_in_the_portal(llama: Model) -> None:
    olivia = Client()
    olivia.force_login(make_user("olivia", Role.OFFICER))  # type: ignore[arg-type]
    edit = reverse("portal:model_edit", args=[llama.pk])
    model_form = {
        "public_id": "llama",
        "description": "",
        "capabilities": ["chat"],
        "timeout_seconds": "60",
        "max_tokens": "",
        "status": "active",
        "at_sunset": "refuse",
        "routing": '{"split": {"v1": 95, "v3": 5}}',
    }
    refused = olivia.post(edit, {**model_form, "step": "review"})
    assert refused.status_code == 200
    assert "'v3' is not a version" in " ".join(refused.context["form"].errors["routing"])

    model_form["routing"] = '{"split": {"v1": 95, "v2": 5}, "aliases": {"stable": "v1"}}'
    plan = reviewed(olivia, edit, model_form)
    assert changed_fields(plan) == [
        ("models[llama]", "routing", '{"aliases": {"stable": "v1"}, "split": {"v1": 95, "v2": 5}}')
    ]
    assert applied(olivia, edit, model_form, plan) == 302
    assert Model.objects.get(pk=llama.pk).routing == {
        "split": {"v1": 95, "v2": 5},
        "aliases": {"stable": "v1"},
    }
    assert AuditEvent.objects.filter(action="model.update", actor="olivia").count() == 1

    page = olivia.get(reverse("portal:models")).content.decode()
    assert "<code>v2</code> (llama-v2)" in page
    assert "<code>stable</code> → <code>v1</code>" in page

    chatbot = UseCase.objects.get(slug="chatbot")
    use_case_edit = reverse("portal:use_case_edit", args=[chatbot.pk])
    shown = olivia.get(use_case_edit)
    use_case_form = {
        **{k: v for k, v in shown.context["form"].initial.items() if v is not None},
        "model_pins": '{"llama": "stable"}',
        "guardrails-TOTAL_FORMS": "0",
        "guardrails-INITIAL_FORMS": "0",
    }
    plan = reviewed(olivia, use_case_edit, use_case_form)
    assert changed_fields(plan) == [
        ("use_cases[acme/chatbot]", "model_pins", '{"llama": "stable"}')
    ]
    assert applied(olivia, use_case_edit, use_case_form, plan) == 302
    assert UseCase.objects.get(pk=chatbot.pk).model_pins == {"llama": "stable"}
