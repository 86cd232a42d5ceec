"""A use case's fallback models and a class's degradation wait on every officer's door
(issue 27, docs/models.md "Fallbacks and degradation by class"): the API (its 400s name the
field, developers may not set them, writes are audited and republished), the admin, policy as
code (round trip, errors at their place, the order apply needs) and the portal's forms. The
rules themselves and the snapshot: tests/governance/test_model_fallbacks.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import valkey
import yaml
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from gateway.policy import SNAPSHOT_KEY
from governance.audit import Actor
from governance.choices import UseCaseStatus
from governance.models import AuditEvent, Model, PriorityClass, UseCase
from governance.policy_as_code.apply import policy_apply
from governance.policy_as_code.errors import PolicyInvalid
from governance.policy_as_code.export import policy_export
from governance.policy_as_code.plan import plan_build
from governance.policy_as_code.schema import policy_load, policy_parse
from governance.policy_as_code.selectors import policy_current
from governance.roles import Role
from testkit.factories import make_model, make_tenant, make_use_case, make_user
from testkit.officer_plans import applied, changed_fields, reviewed, shown_form
from tests.governance.test_admin import _use_case_form
from tests.governance.test_policy_as_code_validation import acme_policy

pytestmark = pytest.mark.django_db

PRIYA = Actor(username="priya", is_system=True)


@pytest.fixture
def chatbot() -> UseCase:
    """acme's chatbot may call large and small; "other" exists but is not its."""
    large, small = make_model("large"), make_model("small")
    make_model("other")
    return make_use_case(make_tenant("acme"), "chatbot", models=(large, small))


@pytest.fixture
def officer_api() -> APIClient:
    api = APIClient()
    api.force_authenticate(make_user("olivia", Role.OFFICER))
    return api


# --- the API ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fallbacks", "says"),
    [
        ({"large": ["other"]}, "'other' is not one of the use case's models."),
        ({"large": ["large"]}, "'large' cannot fall back to itself."),
        ({"large": ["small", "small"]}, "a fallback is listed twice"),
        ({"large": []}, "give 1 to 3 fallbacks"),
        ({"large": "small"}, "Expected a list"),
        ({"no such model": ["small"]}, "'no such model' is not a model id"),
    ],
)
def test_a_bad_fallback_chain_is_a_400_naming_model_fallbacks(
    chatbot: UseCase, officer_api: APIClient, fallbacks: dict[str, Any], says: str
) -> None:
    path = f"/api/use-cases/{chatbot.pk}/"
    refused = officer_api.patch(path, {"model_fallbacks": fallbacks}, format="json")
    assert refused.status_code == 400
    assert set(refused.data) == {"model_fallbacks"}
    assert says in str(refused.data["model_fallbacks"])
    assert UseCase.objects.get(pk=chatbot.pk).model_fallbacks == {}
    assert not AuditEvent.objects.exists()


def test_fallbacks_and_a_class_wait_set_by_api_are_audited_and_republished(
    chatbot: UseCase,
    officer_api: APIClient,
    live_valkey_settings: Any,
    valkey_client: valkey.Valkey,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        answer = officer_api.patch(
            f"/api/use-cases/{chatbot.pk}/",
            {"model_fallbacks": {"large": ["small"]}},
            format="json",
        )
        waited = officer_api.patch(
            "/api/priority-classes/batch/", {"degrade_after_seconds": 0.5}, format="json"
        )
    assert answer.status_code == 200, answer.data
    assert answer.data["model_fallbacks"] == {"large": ["small"]}
    assert waited.status_code == 200, waited.data
    assert waited.data["degrade_after_seconds"] == 0.5

    update = AuditEvent.objects.get(action="usecase.update")
    assert update.actor == "olivia"
    assert ((update.before or {})["model_fallbacks"], (update.after or {})["model_fallbacks"]) == (
        {},
        {"large": ["small"]},
    )
    wait = AuditEvent.objects.get(action="priorityclass.update")
    assert (wait.after or {})["degrade_after_seconds"] == 0.5

    published = orjson.loads(valkey_client.get(SNAPSHOT_KEY))  # type: ignore[arg-type]
    assert published["use_cases"][str(chatbot.pk)]["model_fallbacks"] == {"large": ["small"]}
    assert published["priority_classes"]["batch"]["degrade_after_s"] == 0.5

    emptied = officer_api.patch(
        "/api/priority-classes/batch/", {"degrade_after_seconds": None}, format="json"
    )
    assert emptied.status_code == 200, emptied.data
    assert PriorityClass.objects.get(name="batch").degrade_after_seconds is None


def test_a_negative_class_wait_is_a_400_naming_degrade_after_seconds(
    officer_api: APIClient,
) -> None:
    refused = officer_api.patch(
        "/api/priority-classes/batch/", {"degrade_after_seconds": -1}, format="json"
    )
    assert refused.status_code == 400
    assert set(refused.data) == {"degrade_after_seconds"}
    assert PriorityClass.objects.get(name="batch").degrade_after_seconds is None


def test_a_developer_cannot_set_fallbacks_even_on_a_draft() -> None:
    """Fallbacks decide what serves a use case: the officer's, like its models and pins."""
    large, small = make_model("large"), make_model("small")
    acme = make_tenant("acme")
    draft = make_use_case(acme, "helper", models=(large, small), status=UseCaseStatus.DRAFT)
    alice = APIClient()
    alice.force_authenticate(make_user("alice", Role.DEVELOPER, tenants=(acme,)))
    path = f"/api/use-cases/{draft.pk}/"

    refused = alice.patch(path, {"model_fallbacks": {"large": ["small"]}}, format="json")
    assert refused.status_code == 403
    assert "model_fallbacks" in str(refused.data)
    assert UseCase.objects.get(pk=draft.pk).model_fallbacks == {}
    # What a developer may change on a draft, she still can.
    assert alice.patch(path, {"name": "Helper bot"}, format="json").status_code == 200


# --- the admin -------------------------------------------------------------------------------
def test_the_admin_edits_fallbacks_and_the_class_wait(chatbot: UseCase) -> None:
    root = make_user("root", Role.ADMIN)
    root.is_staff = root.is_superuser = True
    root.save()
    browser = Client()
    browser.force_login(root)  # type: ignore[arg-type]
    change = f"/admin/governance/usecase/{chatbot.pk}/change/"

    refused = browser.post(
        change, {**_use_case_form(chatbot), "model_fallbacks": '{"large": ["other"]}'}
    )
    assert refused.status_code == 200
    assert "&#x27;other&#x27; is not one of the use case&#x27;s models" in refused.content.decode()

    form = {**_use_case_form(chatbot), "model_fallbacks": '{"large": ["small"]}'}
    saved = browser.post(change, form)
    assert saved.status_code == 302, saved.content.decode()[:3000]
    assert UseCase.objects.get(pk=chatbot.pk).model_fallbacks == {"large": ["small"]}
    assert AuditEvent.objects.filter(action="usecase.update", actor="root").count() == 1

    emptied = browser.post(change, {**_use_case_form(chatbot), "model_fallbacks": ""})
    assert emptied.status_code == 302, emptied.content.decode()[:3000]
    assert UseCase.objects.get(pk=chatbot.pk).model_fallbacks == {}

    batch = PriorityClass.objects.get(name="batch")
    class_form = {
        "name": "batch",
        "rank": str(batch.rank),
        "vllm_priority": str(batch.vllm_priority),
        "queue_timeout_seconds": str(batch.queue_timeout_seconds),
        "max_queue_length": str(batch.max_queue_length),
        "max_pool_share": str(batch.max_pool_share),
        "degrade_after_seconds": "2.5",
    }
    waited = browser.post(f"/admin/governance/priorityclass/{batch.pk}/change/", class_form)
    assert waited.status_code == 302, waited.content.decode()[:3000]
    assert PriorityClass.objects.get(pk=batch.pk).degrade_after_seconds == 2.5


# --- policy as code --------------------------------------------------------------------------
def fallback_policy() -> dict[str, Any]:
    """acme's policy with a small model the chatbot falls back to from llama."""
    data = acme_policy()
    data["models"].append(
        {
            "id": "llama-small",
            "capabilities": ["chat"],
            "deployments": [{"served_name": "llama-1b", "replicas": ["http://10.0.0.9:8000"]}],
        }
    )
    chatbot = data["use_cases"][0]
    chatbot["models"] = ["llama", "llama-small"]
    chatbot["model_fallbacks"] = {"llama": ["llama-small"]}
    return data


def exported_data() -> dict[str, Any]:
    loaded = yaml.safe_load(policy_export())
    assert isinstance(loaded, dict)
    return loaded


@pytest.mark.usefixtures("company_guardrails")
def test_policy_as_code_applies_fallbacks_and_class_waits_and_round_trips() -> None:
    policy_apply(document=policy_parse(fallback_policy()), actor=PRIYA)
    assert UseCase.objects.get(slug="chatbot").model_fallbacks == {"llama": ["llama-small"]}
    assert not plan_build(policy_parse(fallback_policy()), policy_current()).has_changes

    data = exported_data()
    for entry in data["priority_classes"]:
        if entry["name"] == "low":
            entry["degrade_after_seconds"] = 0
    policy_apply(document=policy_parse(data), actor=PRIYA)
    assert PriorityClass.objects.get(name="low").degrade_after_seconds == 0.0

    exported = policy_export()
    assert "model_fallbacks: {llama: [llama-small]}" in exported
    waits = {
        entry["name"]: entry.get("degrade_after_seconds")
        for entry in yaml.safe_load(exported)["priority_classes"]
    }
    assert exported.count("degrade_after_seconds") == 1  # left out where it is empty
    assert waits["low"] == 0.0
    assert not plan_build(policy_load(exported), policy_current()).has_changes

    # Left out again: the class degrades only on a refusal.
    for entry in data["priority_classes"]:
        entry.pop("degrade_after_seconds", None)
    policy_apply(document=policy_parse(data), actor=PRIYA)
    assert PriorityClass.objects.get(name="low").degrade_after_seconds is None


@pytest.mark.usefixtures("company_guardrails")
def test_policy_as_code_allows_a_model_and_falls_back_to_it_in_one_apply() -> None:
    """The use case checks its chains against the models it has: apply gives it the model
    before the chain that names it."""
    data = fallback_policy()
    chatbot = data["use_cases"][0]
    chatbot["models"], chatbot["model_fallbacks"] = ["llama"], {}
    policy_apply(document=policy_parse(data), actor=PRIYA)

    plan = policy_apply(document=policy_parse(fallback_policy()), actor=PRIYA).plan
    assert plan.has_changes
    use_case = UseCase.objects.get(slug="chatbot")
    assert sorted(m.public_id for m in use_case.allowed_models.all()) == ["llama", "llama-small"]
    assert use_case.model_fallbacks == {"llama": ["llama-small"]}
    assert not plan_build(policy_parse(fallback_policy()), policy_current()).has_changes


@pytest.mark.usefixtures("company_guardrails")
def test_policy_as_code_clears_chains_a_model_taken_off_the_use_case_left() -> None:
    """A model taken off the use case's list (by the API) leaves its chains: the file does not
    show them, and its next apply to the use case clears them, rather than stumble on them."""
    policy_apply(document=policy_parse(fallback_policy()), actor=PRIYA)
    use_case = UseCase.objects.get(slug="chatbot")
    use_case.allowed_models.remove(Model.objects.get(public_id="llama-small"))

    data = exported_data()
    assert "model_fallbacks" not in data["use_cases"][0]
    data["use_cases"][0]["name"] = "Chatbot v2"
    policy_apply(document=policy_parse(data), actor=PRIYA)
    use_case.refresh_from_db()
    assert (use_case.name, use_case.model_fallbacks) == ("Chatbot v2", {})


def test_policy_as_code_names_bad_chains_and_class_waits_at_their_place() -> None:
    data = fallback_policy()
    data["use_cases"][0]["model_fallbacks"] = {
        "llama": ["mistral"],  # a model, but not one of the use case's in the file
        "llama-small": ["llama-small"],
    }
    data["priority_classes"] = [
        {"name": "dev", "rank": 3, "vllm_priority": 3, "degrade_after_seconds": -1}
    ]
    with pytest.raises(PolicyInvalid) as refused:
        policy_parse(data)
    problems = {(problem.path, problem.message) for problem in refused.value.problems}
    assert (
        "use_cases[acme/chatbot].model_fallbacks.llama",
        "'mistral' is not one of the use case's models (llama, llama-small)",
    ) in problems
    assert (
        "use_cases[acme/chatbot].model_fallbacks.llama-small",
        "'llama-small' cannot fall back to itself",
    ) in problems
    assert any(
        path == "priority_classes[dev].degrade_after_seconds" for path, _message in problems
    ), problems


# --- the portal ------------------------------------------------------------------------------


def test_an_officer_sets_fallbacks_and_a_class_wait_in_the_portal(chatbot: UseCase) -> None:
    olivia = Client()
    olivia.force_login(make_user("olivia", Role.OFFICER))  # type: ignore[arg-type]

    edit = reverse("portal:use_case_edit", args=[chatbot.pk])
    page = olivia.get(edit).content.decode()
    assert 'name="model_fallbacks"' in page
    form = {
        **shown_form(olivia, edit),
        "guardrails-TOTAL_FORMS": "0",
        "guardrails-INITIAL_FORMS": "0",
    }
    refused = olivia.post(
        edit, {**form, "model_fallbacks": '{"large": ["other"]}', "step": "review"}
    )
    assert refused.status_code == 200
    assert "'other' is not one of the use case's models" in " ".join(
        refused.context["form"].errors["model_fallbacks"]
    )

    form["model_fallbacks"] = '{"large": ["small"]}'
    plan = reviewed(olivia, edit, form)
    assert changed_fields(plan) == [
        ("use_cases[acme/chatbot]", "model_fallbacks", '{"large": ["small"]}')
    ]
    assert applied(olivia, edit, form, plan) == 302
    assert UseCase.objects.get(pk=chatbot.pk).model_fallbacks == {"large": ["small"]}
    assert AuditEvent.objects.filter(action="usecase.update", actor="olivia").count() == 1

    class_edit = reverse("portal:priority_class_edit", args=["low"])
    class_form = {**shown_form(olivia, class_edit), "degrade_after_seconds": "1.5"}
    plan = reviewed(olivia, class_edit, class_form)
    assert changed_fields(plan) == [("priority_classes[low]", "degrade_after_seconds", "1.5")]
    assert applied(olivia, class_edit, class_form, plan) == 302
    assert PriorityClass.objects.get(name="low").degrade_after_seconds == 1.5
    governance_page = olivia.get(reverse("portal:governance")).content.decode()
    assert '<td class="num">1.5</td>' in governance_page

    class_form["degrade_after_seconds"] = ""
    plan = reviewed(olivia, class_edit, class_form)
    assert applied(olivia, class_edit, class_form, plan) == 302
    assert PriorityClass.objects.get(name="low").degrade_after_seconds is None
