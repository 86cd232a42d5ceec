"""An officer creates and edits use cases in the portal: limits, models, guardrails, records.

Personas: olivia and oscar are governance officers; alice a developer of acme, audrey an
auditor, mallory has an account and no role.
"""

from __future__ import annotations

import json

import pytest

from gateway.policy import VERSION_KEY
from governance.choices import UseCaseStatus
from governance.models import AuditEvent, GuardrailSelection, Model, UseCase
from governance.roles import Role
from testkit.factories import make_model, make_tenant, make_use_case
from tests.portal.test_officer_support import (
    apply,
    client_for,
    guardrail_rows,
    plan_cells,
    review,
    url,
)

pytestmark = pytest.mark.django_db


def use_case_data(**changes: str) -> dict[str, object]:
    data: dict[str, object] = {
        "tenant": "acme",
        "slug": "support-bot",
        "name": "Support bot",
        "kind": "chatbot",
        "purpose": "Answer customers' questions about their cards.",
        "data_classification": "confidential",
        "namespace": "prod",
        "ticket_ref": "CHG-1001",
        "models": ["llama"],
        "requests_per_minute": "60",
        "tokens_per_minute": "",
        "tokens_per_day": "200000",
        "max_concurrent": "",
        "guardrail_failure": "closed",
        "record_policy": "metadata",
        "record_retention_days": "30",
        **guardrail_rows({"guardrail": "pii", "side": "request", "action": "redact"}),
    }
    data.update(changes)
    return data


@pytest.fixture
def acme():
    tenant = make_tenant("acme")
    make_model("llama")
    make_model("mistral")
    return tenant


@pytest.fixture
def olivia(acme):
    return client_for("olivia", Role.OFFICER)


def test_review_lists_the_use_case_its_limits_and_its_guardrail(olivia) -> None:
    html = review(olivia, url("use_case_new"), use_case_data())

    cells = {(c.path, c.field): c.after for c in plan_cells(html)}
    assert {c.action for c in plan_cells(html)} == {"create"}
    assert cells[("use_cases[acme/support-bot]", "name")] == '"Support bot"'
    assert cells[("use_cases[acme/support-bot]", "models")] == '["llama"]'
    assert cells[("use_cases[acme/support-bot]", "limits.requests_per_minute")] == "60"
    assert cells[("use_cases[acme/support-bot]", "limits.tokens_per_day")] == "200000"
    assert cells[("use_cases[acme/support-bot]", "records.retention_days")] == "30"
    assert cells[("use_cases[acme/support-bot]", "status")] == '"draft"'
    assert ("use_cases[acme/support-bot]", "limits.tokens_per_minute") not in cells
    assert cells[("use_cases[acme/support-bot].guardrails[request:pii]", "action")] == '"redact"'
    # The settings shown are the complete ones the guardrail will run with (defaults filled).
    config = json.loads(cells[("use_cases[acme/support-bot].guardrails[request:pii]", "config")])
    assert "EMAIL_ADDRESS" in config["entities"]
    assert not UseCase.objects.exists()
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_apply_creates_it_with_guardrail_and_limits_through_the_services(
    olivia, settings, valkey_url, valkey_client, django_capture_on_commit_callbacks
) -> None:
    settings.VALKEY_URL = valkey_url
    html = review(olivia, url("use_case_new"), use_case_data())

    with django_capture_on_commit_callbacks(execute=True):
        response = apply(olivia, url("use_case_new"), use_case_data(), html)

    use_case = UseCase.objects.get(tenant__slug="acme", slug="support-bot")
    assert response.status_code == 302
    assert response["Location"] == url("use_case_detail", use_case.pk)
    assert use_case.status == UseCaseStatus.DRAFT
    assert (use_case.requests_per_minute, use_case.tokens_per_day) == (60, 200000)
    assert use_case.tokens_per_minute is None
    assert use_case.data_classification == "confidential"
    assert use_case.record_retention_days == 30
    assert [m.public_id for m in use_case.allowed_models.all()] == ["llama"]
    selection = use_case.guardrails.get()
    assert (selection.guardrail, selection.side, selection.action) == ("pii", "request", "redact")
    assert list(AuditEvent.objects.values_list("action", "actor")) == [
        ("usecase.create", "olivia"),
        ("guardrailselection.create", "olivia"),
    ]
    assert int(valkey_client.get(VERSION_KEY)) == 1


def test_submit_at_once_moves_it_to_review(olivia) -> None:
    data = use_case_data(submit_now="on")
    html = review(olivia, url("use_case_new"), data)
    assert next(c for c in plan_cells(html) if c.field == "status").after == '"submitted"'
    assert "lifecycle: submit" in html

    apply(olivia, url("use_case_new"), data, html)

    assert UseCase.objects.get(slug="support-bot").status == UseCaseStatus.SUBMITTED
    assert AuditEvent.objects.filter(action="usecase.submit", actor="olivia").exists()


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"requests_per_minute": "0"}, "requests_per_minute", "positive"),
        ({"record_retention_days": "0"}, "record_retention_days", ""),
        ({"slug": "Not A Slug"}, "slug", ""),
        ({"purpose": ""}, "purpose", "required"),
    ],
)
def test_invalid_input_shows_the_fields_error_and_writes_nothing(
    olivia, changes, field, message
) -> None:
    response = olivia.post(url("use_case_new"), {**use_case_data(**changes), "step": "review"})

    assert response.status_code == 200
    errors = response.context["form"].errors
    assert field in errors, errors
    assert message in " ".join(errors[field]).lower()
    assert 'id="plan"' not in response.content.decode()
    assert not UseCase.objects.exists()
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"guardrail": "prompt_injection", "side": "response"}, "runs on request"),
        ({"guardrail": "toxicity", "action": "redact"}, "cannot redact"),
        ({"guardrail": "pii", "config": '{"threshold": "high"}'}, "threshold"),
        ({"guardrail": "banned_topics", "config": '{"topics": ["x"]}'}, "model"),
    ],
)
def test_a_guardrail_the_services_refuse_is_shown_and_nothing_is_written(
    olivia, row, message
) -> None:
    data = use_case_data(**guardrail_rows(row))
    response = olivia.post(url("use_case_new"), {**data, "step": "review"})

    assert response.status_code == 200
    problems = " ".join(response.context["form"].non_field_errors())
    assert message in problems, problems
    assert "guardrails[" in problems
    assert not UseCase.objects.exists()
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_bad_json_settings_are_refused_on_the_row(olivia) -> None:
    data = use_case_data(**guardrail_rows({"guardrail": "pii", "config": "{not json"}))
    response = olivia.post(url("use_case_new"), {**data, "step": "review"})

    assert response.status_code == 200
    assert "Not JSON" in " ".join(response.context["formset"].forms[0].errors["config"])
    assert not UseCase.objects.exists()


def test_edit_changes_limits_and_takes_a_guardrail_off(olivia, acme) -> None:
    llama = Model.objects.get(public_id="llama")
    use_case = make_use_case(acme, "support-bot", models=(llama,), requests_per_minute=60)
    GuardrailSelection.objects.create(
        use_case=use_case, guardrail="secrets", side="request", action="block", config={}
    )
    data = use_case_data(
        requests_per_minute="120",
        tokens_per_day="",
        record_retention_days="90",
        data_classification="internal",
        ticket_ref="",
        purpose="Answer customer questions.",
        name="Support-Bot",
        namespace="prod",
        **guardrail_rows(),
    )
    html = review(olivia, url("use_case_edit", use_case.pk), data)

    changes = [(c.action, c.path, c.field, c.before, c.after) for c in plan_cells(html)]
    assert ("update", "use_cases[acme/support-bot]", "limits.requests_per_minute", "60", "120") in (
        changes
    )
    assert {c[:2] for c in changes if c[0] == "delete"} == {
        ("delete", "use_cases[acme/support-bot].guardrails[request:secrets]")
    }
    assert {c[2] for c in changes if c[0] == "update"} == {"limits.requests_per_minute"}

    response = apply(olivia, url("use_case_edit", use_case.pk), data, html)

    assert response.status_code == 302
    use_case.refresh_from_db()
    assert use_case.requests_per_minute == 120
    assert use_case.status == UseCaseStatus.APPROVED  # the form leaves the lifecycle alone
    assert not use_case.guardrails.exists()
    assert list(AuditEvent.objects.values_list("action", flat=True)) == [
        "usecase.update",
        "guardrailselection.delete",
    ]


@pytest.mark.parametrize(
    ("username", "role"),
    [("alice", Role.DEVELOPER), ("audrey", Role.AUDITOR), ("mallory", None)],
)
def test_only_officers_may_use_the_use_case_forms(acme, username, role) -> None:
    use_case = make_use_case(acme, "chatbot")
    client = client_for(username, *([role] if role else []), tenants=(acme,))
    for target in (url("use_case_new"), url("use_case_edit", use_case.pk)):
        assert client.get(target).status_code == 403
        response = client.post(target, {**use_case_data(slug="chatbot"), "step": "apply"})
        assert response.status_code == 403
    assert UseCase.objects.count() == 1
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_editing_a_use_case_on_legal_hold_keeps_the_hold_and_says_so(olivia, acme) -> None:
    from governance.audit import Actor
    from governance.services.record_policy import use_case_set_legal_hold

    use_case = make_use_case(acme, "support-bot", models=(Model.objects.get(public_id="llama"),))
    use_case_set_legal_hold(
        actor=Actor.system("test"), use_case=use_case, hold=True, reason="Litigation 42"
    )
    data = use_case_data(name="Support bot v2", **guardrail_rows())
    html = review(olivia, url("use_case_edit", use_case.pk), data)

    assert ("update", "name", '"Support-Bot"', '"Support bot v2"') in [
        (c.action, c.field, c.before, c.after) for c in plan_cells(html)
    ]
    assert "on legal hold; kept" in html
    apply(olivia, url("use_case_edit", use_case.pk), data, html)

    use_case.refresh_from_db()
    assert use_case.name == "Support bot v2"
    assert use_case.legal_hold is True
