"""A use case's fallback models and a class's degradation wait, as governance holds and
publishes them (issue 27; docs/models.md, "Fallbacks"). The gateway's side, at real
processes, is tests/gateway/test_model_fallbacks.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from gateway.policy import parse_snapshot
from governance.models import PriorityClass, UseCase
from governance.roles import Role
from governance.snapshot import snapshot_build
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def use_case() -> UseCase:
    large, small, other = make_model("large"), make_model("small"), make_model("other")
    del other  # a model the use case may not call
    return make_use_case(make_tenant("acme"), "chatbot", models=(large, small))


@pytest.mark.parametrize(
    ("fallbacks", "message"),
    [
        (["small"], "Give a JSON object"),
        ({"large": "small"}, "Give a JSON object"),
        ({"large": ["missing"]}, "'missing' is not a model."),
        ({"missing": ["small"]}, "'missing' is not a model."),
        ({"large": ["large"]}, "'large' cannot fall back to itself."),
        ({"large": ["small", "small"]}, "a fallback is listed twice"),
        ({"large": []}, "give 1 to 3 fallbacks"),
    ],
)
def test_a_bad_fallback_chain_is_refused_naming_what_is_wrong(
    use_case: UseCase, fallbacks: Any, message: str
) -> None:
    use_case.model_fallbacks = fallbacks
    with pytest.raises(ValidationError) as refused:
        use_case.full_clean()
    assert message in str(refused.value.message_dict["model_fallbacks"])


def test_the_snapshot_carries_the_chains_and_the_class_wait(use_case: UseCase) -> None:
    use_case.model_fallbacks = {"large": ["small"]}
    use_case.full_clean()
    use_case.save()
    PriorityClass.objects.filter(name="batch").update(degrade_after_seconds=0.25)
    document = snapshot_build(version=1)
    assert document["use_cases"][str(use_case.pk)]["model_fallbacks"] == {"large": ["small"]}
    assert document["priority_classes"]["batch"]["degrade_after_s"] == 0.25
    assert "degrade_after_s" not in document["priority_classes"]["critical"]
    policy = parse_snapshot(orjson.dumps(document))
    assert policy.fallbacks == {use_case.pk: {"large": ("small",)}}
    assert policy.priority_classes["batch"].degrade_after_s == 0.25


def test_a_model_taken_off_the_use_case_leaves_its_chains(use_case: UseCase) -> None:
    use_case.model_fallbacks = {"large": ["small"]}
    use_case.save()
    use_case.allowed_models.remove(*use_case.allowed_models.filter(public_id="small"))
    entry = snapshot_build(version=1)["use_cases"][str(use_case.pk)]
    assert "model_fallbacks" not in entry  # the gateway never meets a model it may not call


@pytest.fixture
def officer_api() -> APIClient:
    api = APIClient()
    api.force_authenticate(make_user("olivia", Role.OFFICER))
    return api


def test_a_model_and_its_fallback_can_be_granted_in_one_write(
    use_case: UseCase, officer_api: APIClient
) -> None:
    """The chain is checked against the models the same request sets, not the stored ones;
    a fallback outside them is refused and nothing is written."""
    path = f"/api/use-cases/{use_case.pk}/"
    refused = officer_api.patch(path, {"model_fallbacks": {"large": ["other"]}}, format="json")
    assert refused.status_code == 400, refused.data
    assert "'other' is not one of the use case's models." in str(refused.data["model_fallbacks"])
    assert UseCase.objects.get(pk=use_case.pk).model_fallbacks == {}

    both = officer_api.patch(
        path,
        {"allowed_models": ["large", "small", "other"], "model_fallbacks": {"large": ["other"]}},
        format="json",
    )
    assert both.status_code == 200, both.data
    assert UseCase.objects.get(pk=use_case.pk).model_fallbacks == {"large": ["other"]}


def test_taking_a_model_off_a_use_case_takes_it_out_of_its_chains(
    use_case: UseCase, officer_api: APIClient
) -> None:
    path = f"/api/use-cases/{use_case.pk}/"
    officer_api.patch(path, {"model_fallbacks": {"large": ["small"]}}, format="json")
    narrowed = officer_api.patch(path, {"allowed_models": ["large"]}, format="json")
    assert narrowed.status_code == 200, narrowed.data
    assert UseCase.objects.get(pk=use_case.pk).model_fallbacks == {}
    renamed = officer_api.patch(path, {"name": "Chat bot"}, format="json")  # still saves
    assert renamed.status_code == 200, renamed.data
