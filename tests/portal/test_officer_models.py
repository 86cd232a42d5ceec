"""An officer creates and edits models and their deployments in the portal.

Each form becomes the model's record of the policy file, planned by the policy-as-code
engine, rehearsed through the services (their refusals land on the fields), shown as a diff,
and applied only as reviewed: audited, and republished in the gateway's snapshot.
Personas: olivia is a governance officer; alice a developer, audrey an auditor, mallory has
no role.
"""

from __future__ import annotations

import re

import pytest

from gateway.policy import SNAPSHOT_KEY, VERSION_KEY, parse_snapshot
from governance.models import AuditEvent, Deployment, Model
from governance.roles import Role
from testkit.factories import make_model
from tests.portal.test_officer_support import apply, client_for, plan_cells, review, text, url

pytestmark = pytest.mark.django_db


def model_data(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "public_id": "qwen-2.5-72b",
        "description": "Qwen for long documents",
        "capabilities": ["chat", "completions"],
        "timeout_seconds": "120",
        "max_tokens": "8192",
    }
    data.update(changes)
    return data


def deployment_data(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "served_name": "qwen-h200",
        "replicas": "http://vllm-0.qwen:8000\nhttp://vllm-1.qwen:8000\n",
        "node_pool": "h200",
        "lora_adapters": "legal-v2",
        "max_in_flight_per_replica": "32",
        "active": "on",
    }
    data.update(changes)
    return data


@pytest.fixture
def olivia():
    return client_for("olivia", Role.OFFICER)


@pytest.fixture
def llama():
    return make_model("llama", replicas=["http://vllm-0.llama:8000"])


@pytest.fixture
def published(settings, valkey_url, valkey_client, django_capture_on_commit_callbacks):
    """Applies publish the gateway's snapshot to a real Valkey, once their transaction commits."""
    settings.VALKEY_URL = valkey_url

    def run(action):
        with django_capture_on_commit_callbacks(execute=True):
            response = action()
        return response, parse_snapshot(valkey_client.get(SNAPSHOT_KEY))

    run.client = valkey_client  # type: ignore[attr-defined]
    return run


def test_a_new_model_is_planned_then_applied_audited_and_published(olivia, published) -> None:
    html = review(olivia, url("model_new"), model_data())

    assert {(c.action, c.path, c.field, c.after) for c in plan_cells(html)} == {
        ("create", "models[qwen-2.5-72b]", "description", '"Qwen for long documents"'),
        ("create", "models[qwen-2.5-72b]", "capabilities", '["chat", "completions"]'),
        ("create", "models[qwen-2.5-72b]", "timeout_seconds", "120.0"),
        ("create", "models[qwen-2.5-72b]", "max_tokens", "8192"),
    }
    assert not Model.objects.filter(public_id="qwen-2.5-72b").exists()  # reviewing saves nothing

    response, _snapshot = published(lambda: apply(olivia, url("model_new"), model_data(), html))

    assert response.status_code == 302
    assert response["Location"] == url("models")
    model = Model.objects.get(public_id="qwen-2.5-72b")
    assert (model.timeout_seconds, model.max_tokens) == (120.0, 8192)
    assert list(AuditEvent.objects.values_list("action", "actor")) == [("model.create", "olivia")]
    assert int(published.client.get(VERSION_KEY)) == 1


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        # the parser's rule, as the model's clean() says it: at least one capability
        ({"capabilities": []}, "capabilities", "at least one"),
        ({"timeout_seconds": "0.01"}, "timeout_seconds", "0.1"),
        ({"public_id": "no spaces please"}, "public_id", "Use letters, digits"),
        ({"public_id": "llama"}, "public_id", "already exists"),
        ({"max_tokens": "0"}, "max_tokens", "positive"),
    ],
)
def test_an_invalid_model_shows_the_error_on_its_field_and_writes_nothing(
    olivia, llama, changes, field, message
) -> None:
    response = olivia.post(url("model_new"), {**model_data(**changes), "step": "review"})

    assert response.status_code == 200
    errors = response.context["form"].errors
    assert field in errors, errors
    assert message in " ".join(errors[field])
    assert f'id="id_{field}_errors"' in response.content.decode()
    assert Model.objects.count() == 1
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_editing_a_model_changes_only_its_fields_and_keeps_its_deployments(
    olivia, llama, published
) -> None:
    edit_url = url("model_edit", llama.pk)
    page = olivia.get(edit_url).content.decode()
    assert re.search(r'<input type="text" name="public_id" value="llama"[^>]* disabled', page)

    data = model_data(public_id="llama", capabilities=["chat", "completions"])
    html = review(olivia, edit_url, data)

    assert sorted((c.action, c.field, c.before, c.after) for c in plan_cells(html)) == [
        ("update", "description", '""', '"Qwen for long documents"'),
        ("update", "max_tokens", "—", "8192"),
        ("update", "timeout_seconds", "60.0", "120.0"),
    ]
    response, snapshot = published(lambda: apply(olivia, edit_url, data, html))

    assert response.status_code == 302
    llama.refresh_from_db()
    assert llama.timeout_seconds == 120.0
    assert list(llama.deployments.values_list("served_name", flat=True)) == ["llama"]
    assert snapshot.models["llama"].timeout_s == 120.0
    assert snapshot.models["llama"].replicas == ("http://vllm-0.llama:8000",)
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["model.update"]


def test_a_new_deployment_is_planned_then_applied_and_published(olivia, llama, published) -> None:
    new_url = url("deployment_new", llama.pk)
    data = deployment_data(served_name="llama-h200")
    html = review(olivia, new_url, data)

    path = "models[llama].deployments[llama-h200]"
    assert {(c.action, c.path, c.field, c.after) for c in plan_cells(html)} == {
        ("create", path, "replicas", '["http://vllm-0.qwen:8000", "http://vllm-1.qwen:8000"]'),
        ("create", path, "node_pool", '"h200"'),
        ("create", path, "lora_adapters", '["legal-v2"]'),
        ("create", path, "max_in_flight_per_replica", "32"),
        ("create", path, "active", "true"),
    }
    response, snapshot = published(lambda: apply(olivia, new_url, data, html))

    assert response.status_code == 302
    created = Deployment.objects.get(model=llama, served_name="llama-h200")
    assert (created.node_pool, created.max_in_flight_per_replica) == ("h200", 32)
    assert created.lora_adapters == ["legal-v2"]
    assert set(snapshot.models["llama"].replicas) == {
        "http://vllm-0.llama:8000",
        "http://vllm-0.qwen:8000",
        "http://vllm-1.qwen:8000",
    }
    assert list(AuditEvent.objects.values_list("action", "actor")) == [
        ("deployment.create", "olivia")
    ]


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"replicas": ""}, "replicas", "at least one"),
        ({"replicas": "ftp://vllm-0:8000"}, "replicas", "is not an http(s):// base URL"),
        ({"replicas": "http://vllm-0:8000/?debug=1"}, "replicas", "plain base URL"),
        ({"max_in_flight_per_replica": "0"}, "max_in_flight_per_replica", "positive integer"),
        ({"served_name": "llama"}, "served_name", "already has a deployment"),
        ({"served_name": "bad name"}, "served_name", "Use letters, digits"),
    ],
)
def test_an_invalid_deployment_shows_the_error_on_its_field_and_writes_nothing(
    olivia, llama, changes, field, message
) -> None:
    response = olivia.post(
        url("deployment_new", llama.pk), {**deployment_data(**changes), "step": "review"}
    )

    assert response.status_code == 200
    errors = response.context["form"].errors
    assert field in errors, errors
    assert message in " ".join(errors[field])
    assert llama.deployments.count() == 1
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_a_deployment_switched_off_leaves_the_snapshot(olivia, llama, published) -> None:
    make_model("mistral", replicas=["http://vllm-0.mistral:8000"])
    Deployment.objects.create(model=llama, served_name="llama-b", replicas=["http://b:8000"])
    deployment = llama.deployments.get(served_name="llama")
    edit_url = url("deployment_edit", llama.pk, deployment.pk)
    data = deployment_data(
        served_name="llama",
        replicas="http://vllm-0.llama:8000",
        node_pool="",
        lora_adapters="",
        max_in_flight_per_replica="64",
        active="",
    )
    html = review(olivia, edit_url, data)

    assert [(c.action, c.path, c.field, c.before, c.after) for c in plan_cells(html)] == [
        ("update", "models[llama].deployments[llama]", "active", "true", "false")
    ]
    _response, snapshot = published(lambda: apply(olivia, edit_url, data, html))

    assert Deployment.objects.get(pk=deployment.pk).active is False
    assert snapshot.models["llama"].replicas == ("http://b:8000",)
    assert snapshot.models["mistral"].replicas == ("http://vllm-0.mistral:8000",)
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["deployment.update"]


def test_a_deployment_of_another_model_is_not_found(olivia, llama) -> None:
    mistral = make_model("mistral")
    deployment = mistral.deployments.get()

    assert olivia.get(url("deployment_edit", llama.pk, deployment.pk)).status_code == 404


def test_the_models_page_lists_each_model_with_its_deployments(olivia, llama) -> None:
    response = olivia.get(url("models"))

    page = text(response.content.decode())
    assert response.status_code == 200
    assert "Served name Replicas" in page
    assert "llama http://vllm-0.llama:8000" in page
    html = response.content.decode()
    assert f'href="{url("deployment_new", llama.pk)}"' in html
    assert f'href="{url("model_edit", llama.pk)}"' in html
    governance = olivia.get(url("governance")).content.decode()
    assert f'href="{url("models")}"' in governance


@pytest.mark.parametrize(
    ("username", "role"),
    [("alice", Role.DEVELOPER), ("audrey", Role.AUDITOR), ("mallory", None)],
)
def test_only_officers_may_change_models(llama, username, role) -> None:
    client = client_for(username, *([role] if role else []))
    deployment = llama.deployments.get()
    targets = [
        (url("models"), {}),
        (url("model_new"), model_data()),
        (url("model_edit", llama.pk), model_data(public_id="llama")),
        (url("deployment_new", llama.pk), deployment_data()),
        (url("deployment_edit", llama.pk, deployment.pk), deployment_data(served_name="llama")),
    ]
    for target, data in targets:
        assert client.get(target).status_code == 403
        assert client.post(target, {**data, "step": "apply"}).status_code == 403
        assert client.post(f"{target}?validate=public_id", data).status_code == 403
    assert Model.objects.count() == 1
    assert Deployment.objects.count() == 1
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))
