"""A model's lifecycle in governance (docs/models.md): the rules, the audit trail, the
snapshot, every door an officer uses (the API, the admin, policy as code) and beat's
retirement of models past their sunset."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
import pytest
import valkey
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from gateway.policy import SNAPSHOT_KEY, parse_snapshot
from governance.audit import Actor
from governance.models import AuditEvent, Model
from governance.policy_as_code.apply import policy_apply
from governance.policy_as_code.errors import PolicyInvalid
from governance.policy_as_code.export import policy_export
from governance.policy_as_code.plan import plan_build
from governance.policy_as_code.schema import policy_load, policy_parse
from governance.policy_as_code.selectors import policy_current
from governance.roles import Role
from governance.services.generic_records import record_update
from governance.services.model_lifecycle import models_retire_sunset
from governance.snapshot import snapshot_build
from ops.processes import ManagedProcess, wait_until
from runtime.valkey_urls import for_kombu
from testkit.factories import make_model, make_tenant, make_use_case, make_user
from tests.governance.test_policy_as_code_validation import acme_policy

pytestmark = pytest.mark.django_db

NOTICE = "https://docs.example.com/models/llama-sunset"


@pytest.fixture
def olivia() -> Actor:
    return Actor.for_user(make_user("olivia", Role.OFFICER))


@pytest.fixture
def llamas() -> tuple[Model, Model]:
    """llama (chat and completions, called by acme's chatbot) and its successor llama-2."""
    old = make_model("llama", capabilities=["chat", "completions"])
    new = make_model("llama-2", capabilities=["chat", "completions", "embeddings"])
    make_use_case(make_tenant("acme"), "chatbot", models=(old,))
    return old, new


def deprecate(actor: Actor, model: Model, successor: Model, **more: Any) -> Model:
    changes = {
        "status": "deprecated",
        "sunset_at": timezone.now() + timedelta(days=30),
        "successor": successor,
        "notice_url": NOTICE,
        **more,
    }
    return record_update(actor=actor, instance=model, changes=changes)


# --- the rules -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"status": "deprecated", "successor": "new"}, "sunset_at", "needs"),
        ({"status": "deprecated", "sunset_at": "soon"}, "successor", "needs"),
        ({"status": "deprecated", "sunset_at": "soon", "successor": "self"}, "successor", "itself"),
        ({"status": "active", "sunset_at": "soon"}, "sunset_at", "active"),
    ],
)
def test_a_deprecation_without_what_it_needs_is_refused(
    olivia: Actor, llamas: tuple[Model, Model], changes: dict[str, Any], field: str, says: str
) -> None:
    old, new = llamas
    values = {"soon": timezone.now() + timedelta(days=1), "new": new, "self": old}
    with pytest.raises(ValidationError) as refused:
        record_update(
            actor=olivia,
            instance=old,
            changes={k: values.get(v, v) for k, v in changes.items()},
        )
    assert says in " ".join(refused.value.message_dict[field])
    assert not AuditEvent.objects.filter(action__startswith="model.").exists()


def test_a_successor_that_is_retired_lacks_a_capability_or_leads_back_is_refused(
    olivia: Actor, llamas: tuple[Model, Model]
) -> None:
    old, _ = llamas
    small = make_model("small", capabilities=["chat"])
    with pytest.raises(ValidationError, match="lacks completions"):
        deprecate(olivia, old, small)
    twin = make_model("llama-twin", capabilities=["chat", "completions"])
    deprecate(olivia, twin, old)  # llama-twin → llama …
    with pytest.raises(ValidationError, match="leads back"):
        deprecate(olivia, Model.objects.get(pk=old.pk), Model.objects.get(pk=twin.pk))
    record_update(
        actor=olivia, instance=Model.objects.get(pk=twin.pk), changes={"status": "retired"}
    )
    with pytest.raises(ValidationError, match="is retired"):
        deprecate(olivia, Model.objects.get(pk=old.pk), Model.objects.get(pk=twin.pk))


def test_deprecating_stamps_its_date_audits_what_happened_and_republishes(
    olivia: Actor, llamas: tuple[Model, Model]
) -> None:
    """GIVEN acme's chatbot calling llama WHEN olivia deprecates llama for llama-2 THEN
    the trail says so (the generic update with before/after, and model.deprecated), the
    model has its deprecation date and the snapshot carries its lifecycle."""
    old, new = llamas
    before = timezone.now()
    deprecate(olivia, old, new, at_sunset="successor")
    old.refresh_from_db()
    assert old.deprecated_at is not None
    assert old.deprecated_at >= before
    update, deprecated = AuditEvent.objects.filter(action__startswith="model.").order_by("sequence")
    assert (update.action, update.actor) == ("model.update", "olivia")
    assert (update.before or {}).get("status") == "active"
    assert (update.after or {}).get("status") == "deprecated"
    assert deprecated.action == "model.deprecated"
    assert (deprecated.after or {}).get("successor") == "llama-2"

    entries = snapshot_build(version=1)["models"]
    assert entries["llama"]["lifecycle"] == {
        "status": "deprecated",
        "deprecated_at": old.deprecated_at.timestamp(),
        "sunset_at": old.sunset_at.timestamp(),
        "successor": "llama-2",
        "notice_url": NOTICE,
        "at_sunset": "successor",
    }
    assert "lifecycle" not in entries["llama-2"]  # an active model costs the snapshot nothing

    # A second save of the same deprecation keeps its date (the header clients saw).
    stamped = old.deprecated_at
    record_update(actor=olivia, instance=old, changes={"notice_url": NOTICE + "#v2"})
    old.refresh_from_db()
    assert old.deprecated_at == stamped


def test_a_retired_model_without_deployments_stays_in_the_snapshot(
    olivia: Actor, llamas: tuple[Model, Model]
) -> None:
    """So that the gateway answers 410 naming the successor, not 404."""
    old, new = llamas
    deprecate(olivia, old, new)
    old.deployments.all().delete()
    record_update(
        actor=olivia, instance=Model.objects.get(pk=old.pk), changes={"status": "retired"}
    )
    Model.objects.create(public_id="undeployed", capabilities=["chat"])

    models = parse_snapshot(orjson.dumps(snapshot_build(version=1))).models
    assert "undeployed" not in models
    assert models["llama"].replicas == ()
    assert models["llama"].lifecycle is not None
    assert models["llama"].lifecycle.status == "retired"
    assert models["llama"].lifecycle.successor == "llama-2"
    assert AuditEvent.objects.filter(action="model.retired", actor="olivia").count() == 1


# --- beat ----------------------------------------------------------------------------------------
def test_models_past_their_sunset_are_retired_once_as_the_system(
    olivia: Actor, llamas: tuple[Model, Model]
) -> None:
    old, new = llamas
    deprecate(olivia, old, new)
    Model.objects.filter(pk=old.pk).update(sunset_at=timezone.now() - timedelta(seconds=1))
    assert models_retire_sunset() == ["llama"]
    assert models_retire_sunset() == []  # idempotent
    old.refresh_from_db()
    assert old.status == "retired"
    retired = AuditEvent.objects.get(action="model.retired")
    assert retired.actor == "system:model-lifecycle"


@pytest.mark.django_db(transaction=True)  # the worker's connection sees committed rows only
def test_the_beat_task_retires_through_a_real_worker_and_republishes(
    valkey_client: valkey.Valkey, valkey_url: str, celery_worker: ManagedProcess
) -> None:
    from config.celery import app
    from governance.tasks import retire_sunset_models

    olivia = Actor.for_user(make_user("olivia", Role.OFFICER))
    old = make_model("llama")
    new = make_model("llama-2")
    deprecate(olivia, old, new)
    Model.objects.filter(pk=old.pk).update(sunset_at=timezone.now() - timedelta(seconds=1))

    app.conf.update(broker_url=for_kombu(valkey_url), result_backend=for_kombu(valkey_url))
    retire_sunset_models.delay()

    def retired_in_snapshot() -> bool:
        raw = valkey_client.get(SNAPSHOT_KEY)
        if raw is None:
            return False
        entry = orjson.loads(raw)["models"].get("llama", {})  # type: ignore[arg-type]
        return bool(entry.get("lifecycle", {}).get("status") == "retired")

    assert wait_until(retired_in_snapshot, timeout=30), celery_worker.log_tail()
    assert Model.objects.get(pk=old.pk).status == "retired"
    assert AuditEvent.objects.filter(
        action="model.retired", actor="system:model-lifecycle"
    ).exists()


# --- the officer's doors -------------------------------------------------------------------------
def test_an_officer_deprecates_through_the_api_naming_the_successor_by_its_id(
    llamas: tuple[Model, Model],
) -> None:
    api = APIClient()
    api.force_authenticate(make_user("olivia", Role.OFFICER))
    sunset = (timezone.now() + timedelta(days=30)).isoformat()
    body = {"status": "deprecated", "sunset_at": sunset, "successor": "llama-2"}
    answer = api.patch("/api/models/llama/", {**body, "notice_url": NOTICE}, format="json")
    assert answer.status_code == 200, answer.data
    assert answer.data["successor"] == "llama-2"
    assert answer.data["deprecated_at"] is not None
    # deprecated_at is the service's: a client cannot choose it.
    api.patch("/api/models/llama/", {"deprecated_at": "2020-01-01T00:00:00Z"}, format="json")
    assert Model.objects.get(public_id="llama").deprecated_at.year != 2020

    refused = api.patch("/api/models/llama-2/", {"status": "deprecated"}, format="json")
    assert refused.status_code == 400
    assert set(refused.data) >= {"sunset_at", "successor"}
    assert AuditEvent.objects.filter(action="model.deprecated", actor="olivia").count() == 1


def test_an_officer_deprecates_in_the_admin(llamas: tuple[Model, Model]) -> None:
    old, new = llamas
    root = make_user("root", Role.ADMIN)
    root.is_staff = root.is_superuser = True
    root.save()
    browser = Client()
    browser.force_login(root)  # type: ignore[arg-type]
    sunset = timezone.now() + timedelta(days=30)
    form = {
        "public_id": "llama",
        "description": "",
        "capabilities": '["chat", "completions"]',
        "timeout_seconds": "60",
        "max_tokens": "",
        "status": "deprecated",
        "sunset_at_0": sunset.strftime("%Y-%m-%d"),
        "sunset_at_1": sunset.strftime("%H:%M:%S"),
        "successor": str(new.pk),
        "notice_url": NOTICE,
        "at_sunset": "refuse",
        "prices-TOTAL_FORMS": "0",
        "prices-INITIAL_FORMS": "0",
    }
    answer = browser.post(f"/admin/governance/model/{old.pk}/change/", form)
    assert answer.status_code == 302, answer.content.decode()[:3000]
    old.refresh_from_db()
    assert (old.status, old.successor, old.notice_url) == ("deprecated", new, NOTICE)
    assert AuditEvent.objects.filter(action="model.deprecated", actor="root").count() == 1


# --- policy as code ------------------------------------------------------------------------------
def lifecycle_policy() -> dict[str, Any]:
    data = acme_policy()
    data["models"].append(
        {
            "id": "llama-2",
            "capabilities": ["chat"],
            "deployments": [{"served_name": "llama-2", "replicas": ["http://10.0.0.2:8000"]}],
        }
    )
    # The deprecated model comes first in the file: apply puts its successor in place first.
    data["models"][0]["lifecycle"] = {
        "status": "deprecated",
        "sunset_at": "2031-03-01T00:00:00Z",
        "successor": "llama-2",
        "notice_url": NOTICE,
        "at_sunset": "successor",
    }
    return data


@pytest.mark.usefixtures("company_guardrails")
def test_policy_as_code_deprecates_and_round_trips(tmp_path: Any) -> None:
    priya = Actor(username="priya", is_system=True)
    policy_apply(document=policy_parse(lifecycle_policy()), actor=priya)
    llama = Model.objects.get(public_id="llama")
    assert (llama.status, llama.successor.public_id if llama.successor else None) == (
        "deprecated",
        "llama-2",
    )
    assert llama.sunset_at is not None
    assert llama.sunset_at.year == 2031
    assert AuditEvent.objects.filter(action="model.deprecated", actor="priya").count() == 1
    assert not plan_build(policy_parse(lifecycle_policy()), policy_current()).has_changes

    exported = policy_export()
    assert "successor: llama-2" in exported
    assert not plan_build(policy_load(exported), policy_current()).has_changes


@pytest.mark.usefixtures("company_guardrails")
def test_policy_as_code_names_an_unknown_successor_at_its_place() -> None:
    data = lifecycle_policy()
    data["models"][0]["lifecycle"]["successor"] = "nope"
    with pytest.raises(PolicyInvalid) as refused:
        plan_build(policy_parse(data), policy_current())
    assert "models[llama].lifecycle.successor" in str(refused.value)
