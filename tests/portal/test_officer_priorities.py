"""An officer creates and edits priority classes and edits the priority matrix in the portal.

The migrations seed five classes (critical 0 … batch 4) and a full matrix; olivia is a
governance officer, alice a developer, audrey an auditor, mallory has no role.
"""

from __future__ import annotations

import pytest

from gateway.policy import SNAPSHOT_KEY, VERSION_KEY, parse_snapshot
from governance.models import AuditEvent, PriorityClass, PriorityRule
from governance.roles import Role
from portal.officer.forms import matrix_field_name
from tests.portal.test_officer_support import apply, client_for, plan_cells, review, url

pytestmark = pytest.mark.django_db

INTERACTIVE = {
    "name": "interactive",
    "rank": "5",
    "vllm_priority": "5",
    "queue_timeout_seconds": "20",
    "max_queue_length": "300",
    "max_pool_share": "0.5",
}


@pytest.fixture
def olivia():
    return client_for("olivia", Role.OFFICER)


def _matrix_data() -> dict[str, str]:
    return {
        matrix_field_name(rule.environment, rule.namespace): rule.priority_class.name
        for rule in PriorityRule.objects.select_related("priority_class")
    }


def test_a_new_priority_class_is_planned_then_applied_and_audited(olivia) -> None:
    html = review(olivia, url("priority_class_new"), INTERACTIVE)

    assert {(c.action, c.path, c.field, c.after) for c in plan_cells(html)} == {
        ("create", "priority_classes[interactive]", "rank", "5"),
        ("create", "priority_classes[interactive]", "vllm_priority", "5"),
        ("create", "priority_classes[interactive]", "queue_timeout_seconds", "20.0"),
        ("create", "priority_classes[interactive]", "max_queue_length", "300"),
        ("create", "priority_classes[interactive]", "max_pool_share", "0.5"),
    }
    assert not PriorityClass.objects.filter(name="interactive").exists()

    response = apply(olivia, url("priority_class_new"), INTERACTIVE, html)

    assert response.status_code == 302
    created = PriorityClass.objects.get(name="interactive")
    assert (created.rank, created.max_pool_share) == (5, 0.5)
    assert AuditEvent.objects.get().action == "priorityclass.create"


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"max_pool_share": "2"}, "max_pool_share", "1"),
        ({"rank": "2"}, "rank", "also given to"),
        ({"name": "Not Valid"}, "name", ""),
        ({"queue_timeout_seconds": "-1"}, "queue_timeout_seconds", ""),
    ],
)
def test_invalid_priority_class_shows_the_fields_error_and_writes_nothing(
    olivia, changes, field, message
) -> None:
    response = olivia.post(url("priority_class_new"), {**INTERACTIVE, **changes, "step": "review"})

    assert response.status_code == 200
    errors = response.context["form"].errors
    assert field in errors, errors
    assert message in " ".join(errors[field])
    assert not PriorityClass.objects.filter(rank=5).exists()
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_editing_a_class_shows_before_and_after(olivia) -> None:
    data = {**INTERACTIVE, "name": "low", "rank": "3", "vllm_priority": "3"}
    data.update(queue_timeout_seconds="15", max_queue_length="500", max_pool_share="1")
    data["queue_timeout_seconds"] = "45"
    html = review(olivia, url("priority_class_edit", "low"), data)

    assert [(c.action, c.field, c.before, c.after) for c in plan_cells(html)] == [
        ("update", "queue_timeout_seconds", "15.0", "45.0")
    ]
    apply(olivia, url("priority_class_edit", "low"), data, html)

    assert PriorityClass.objects.get(name="low").queue_timeout_seconds == 45.0
    assert AuditEvent.objects.get().action == "priorityclass.update"


def test_the_matrix_changes_one_cell_and_clears_another(
    olivia, settings, valkey_url, valkey_client, django_capture_on_commit_callbacks
) -> None:
    settings.VALKEY_URL = valkey_url
    data = _matrix_data()
    data[matrix_field_name("uat", "demo")] = "high"
    data[matrix_field_name("dev", "qa")] = ""
    html = review(olivia, url("priority_matrix"), data)

    assert sorted((c.action, c.path, c.field, c.before, c.after) for c in plan_cells(html)) == [
        ("delete", "priority_matrix.dev.qa", "class", '"low"', "—"),
        ("update", "priority_matrix.uat.demo", "class", '"standard"', '"high"'),
    ]
    with django_capture_on_commit_callbacks(execute=True):
        response = apply(olivia, url("priority_matrix"), data, html)

    assert response.status_code == 302
    rule = PriorityRule.objects.get(environment="uat", namespace="demo")
    assert rule.priority_class.name == "high"
    assert not PriorityRule.objects.filter(environment="dev", namespace="qa").exists()
    assert sorted(AuditEvent.objects.values_list("action", flat=True)) == [
        "priorityrule.delete",
        "priorityrule.update",
    ]
    assert int(valkey_client.get(VERSION_KEY)) == 1
    assert parse_snapshot(valkey_client.get(SNAPSHOT_KEY)) is not None


def test_the_matrix_page_shows_every_cell_labelled(olivia) -> None:
    response = olivia.get(url("priority_matrix"))

    html = response.content.decode()
    assert response.status_code == 200
    field = matrix_field_name("prod", "prod-dr")
    assert f'<label class="sr-only" for="id_{field}">Production tenants, prod-DR namespace' in html
    assert '<option value="critical" selected>critical</option>' in html


@pytest.mark.parametrize(
    ("username", "role"),
    [("alice", Role.DEVELOPER), ("audrey", Role.AUDITOR), ("mallory", None)],
)
def test_only_officers_may_change_priorities(username, role) -> None:
    client = client_for(username, *([role] if role else []))
    targets = (url("priority_class_new"), url("priority_class_edit", "low"), url("priority_matrix"))
    for target in targets:
        assert client.get(target).status_code == 403
        assert client.post(target, {**INTERACTIVE, "step": "apply"}).status_code == 403
    assert PriorityClass.objects.count() == 5
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))
