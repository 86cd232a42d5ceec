"""The officer's forms check each field as it is left or changed (htmx), with the same checks
as "Review change": the form's, then the plan's and the rehearsed services'. Nothing is saved.

A field posts the whole form to its page's URL with ``?validate=<field>``; the answer is that
field's errors alone, which htmx puts in the field's errors' place (``<id>_errors``), the
place its input names in ``aria-describedby`` from the start.
Personas: olivia is a governance officer; mallory has an account and no role.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest

from governance.models import AuditEvent, Deployment, Model, PriorityClass, SlaClass, Tenant
from governance.roles import Role
from testkit.factories import make_model, make_tenant, make_use_case
from tests.portal.test_officer_models import deployment_data, model_data
from tests.portal.test_officer_sla_classes import sla_data
from tests.portal.test_officer_support import client_for, guardrail_rows, text, url

pytestmark = pytest.mark.django_db

_ERROR_ITEM = re.compile(r"<li>(.*?)</li>", re.S)

NEWCO = {
    "slug": "newco",
    "name": "NewCo Payments",
    "business_unit": "Retail banking",
    "application_id": "APP-4242",
    "environment": "uat",
    "owner_email": "owner@newco.example",
    "contacts": "",
}
INTERACTIVE = {
    "name": "interactive",
    "rank": "5",
    "vllm_priority": "5",
    "queue_timeout_seconds": "20",
    "max_queue_length": "300",
    "max_pool_share": "0.5",
}


def use_case_data(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "tenant": "acme",
        "slug": "support-bot",
        "name": "Support bot",
        "kind": "chatbot",
        "purpose": "Answer customers' questions about their cards.",
        "data_classification": "confidential",
        "namespace": "prod",
        "models": ["llama"],
        "guardrail_failure": "closed",
        "record_policy": "metadata",
        "record_retention_days": "30",
        **guardrail_rows(),
    }
    data.update(changes)
    return data


@pytest.fixture
def world():
    """acme with its chatbot, model llama with one deployment."""
    acme = make_tenant("acme")
    llama = make_model("llama")
    chatbot = make_use_case(acme, "chatbot", models=(llama,))
    return {"llama": llama, "chatbot": chatbot}


@pytest.fixture
def olivia(world):
    return client_for("olivia", Role.OFFICER)


def validate(client: Any, page_url: str, field: str, data: Mapping[str, object]) -> list[str]:
    """The errors the page gives ``field`` for ``data``, as htmx asks for them."""
    response = client.post(f"{page_url}?validate={field}", data, headers={"HX-Request": "true"})
    assert response.status_code == 200, response.content
    return [text(item) for item in _ERROR_ITEM.findall(response.content.decode())]


def _targets(world: dict[str, Any]) -> dict[str, str]:
    llama, chatbot = world["llama"], world["chatbot"]
    return {
        "tenant": url("tenant_new"),
        "use_case": url("use_case_new"),
        "priority_class": url("priority_class_new"),
        "model": url("model_new"),
        "deployment": url("deployment_new", llama.pk),
        "sla_class": url("sla_class_new", chatbot.pk),
    }


@pytest.mark.parametrize(
    ("form", "data", "field", "message"),
    [
        # the form's own checks
        ("tenant", {**NEWCO, "owner_email": ""}, "owner_email", "This field is required."),
        ("use_case", use_case_data(record_retention_days="x"), "record_retention_days", "number"),
        ("priority_class", {**INTERACTIVE, "rank": "one"}, "rank", "Enter a whole number."),
        ("model", model_data(public_id="llama"), "public_id", "already exists"),
        ("deployment", deployment_data(served_name="llama"), "served_name", "already has"),
        ("sla_class", sla_data(windows="tonight"), "windows", "write days, then hours"),
        # the policy file's rules and the services' refusals, from the rehearsed plan
        ("tenant", {**NEWCO, "application_id": "4242"}, "application_id", "CMDB form"),
        ("use_case", use_case_data(tokens_per_day="0"), "tokens_per_day", "positive integer"),
        ("priority_class", {**INTERACTIVE, "rank": "2"}, "rank", "also given to"),
        ("model", model_data(capabilities=[]), "capabilities", "at least one"),
        ("deployment", deployment_data(replicas="ftp://x:1"), "replicas", "http(s)://"),
        ("sla_class", sla_data(time_zone="Mars/Olympus"), "time_zone", "is not a time zone"),
        ("sla_class", sla_data(windows=""), "turnaround_seconds", "is required without"),
    ],
)
def test_a_field_gets_its_own_error_and_nothing_is_saved(
    olivia, world, form, data, field, message
) -> None:
    counts = [m.objects.count() for m in (Tenant, PriorityClass, Model, Deployment, SlaClass)]

    errors = validate(olivia, _targets(world)[form], field, data)

    assert len(errors) == 1, errors
    assert message in errors[0]
    assert counts == [
        m.objects.count() for m in (Tenant, PriorityClass, Model, Deployment, SlaClass)
    ]
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


@pytest.mark.parametrize(
    ("form", "data", "field"),
    [
        ("tenant", NEWCO, "application_id"),
        ("use_case", use_case_data(tokens_per_day="100000"), "tokens_per_day"),
        ("priority_class", INTERACTIVE, "rank"),
        ("model", model_data(), "capabilities"),
        ("deployment", deployment_data(), "replicas"),
        ("sla_class", sla_data(), "windows"),
    ],
)
def test_a_valid_field_gets_no_error(olivia, world, form, data, field) -> None:
    assert validate(olivia, _targets(world)[form], field, data) == []


def test_only_the_asked_fields_errors_come_back(olivia, world) -> None:
    """A form half filled in: the field just left is fine, so nothing is said about the
    others (not yet filled in) there."""
    data = {**NEWCO, "name": "", "owner_email": ""}

    assert validate(olivia, url("tenant_new"), "slug", data) == []
    assert validate(olivia, url("tenant_new"), "name", data) == ["This field is required."]


def test_a_guardrail_rows_field_is_checked_too(olivia, world) -> None:
    data = use_case_data(**guardrail_rows({"guardrail": "pii", "config": "{not json"}))

    errors = validate(olivia, url("use_case_new"), "guardrails-0-config", data)

    assert len(errors) == 1
    assert errors[0].startswith("Not JSON")


def test_an_unknown_field_is_a_bad_request(olivia, world) -> None:
    response = olivia.post(f"{url('tenant_new')}?validate=nope", NEWCO)

    assert response.status_code == 400


@pytest.mark.parametrize("form", ["tenant", "use_case", "priority_class", "model", "deployment"])
def test_each_field_asks_for_its_check_and_names_its_errors_place(olivia, world, form) -> None:
    page_url = _targets(world)[form]
    html = olivia.get(page_url).content.decode()

    inputs = re.findall(r"<(?:input|select|textarea)\b[^>]*>", html)
    checked = [tag for tag in inputs if "hx-post=" in tag]
    assert len(checked) >= 4
    for tag in checked:
        name = re.search(r'name="([^"]+)"', tag)
        assert name, tag
        assert f'hx-post="{page_url}?validate={name.group(1)}"' in tag
        target = re.search(r'hx-target="#([^"]+)"', tag)
        assert target, tag
        assert re.search(rf'aria-describedby="[^"]*\b{target.group(1)}\b', tag), tag
        assert f'<div class="field-errors" id="{target.group(1)}" aria-live="polite">' in html
        trigger = "change" if tag.startswith(("<select", '<input type="checkbox"')) else "blur"
        assert f'hx-trigger="{trigger}"' in tag, tag


def test_the_sla_class_form_checks_each_field(olivia, world) -> None:
    page_url = url("sla_class_new", world["chatbot"].pk)
    html = olivia.get(page_url).content.decode()

    assert f'hx-post="{page_url}?validate=time_zone"' in html
    assert 'aria-describedby="id_time_zone_helptext id_time_zone_errors"' in html


def test_without_javascript_the_full_submit_puts_the_error_in_the_same_place(olivia) -> None:
    response = olivia.post(url("tenant_new"), {**NEWCO, "application_id": "4242"})

    html = response.content.decode()
    place = re.search(
        r'<div class="field-errors" id="id_application_id_errors"[^>]*>(.*?)</div>', html, re.S
    )
    assert place, html
    assert "CMDB form" in text(place.group(1))
    assert re.search(r'<input[^>]*name="application_id"[^>]*aria-invalid="true"', html)


def test_a_disabled_field_is_not_checked(olivia, world) -> None:
    html = olivia.get(url("model_edit", world["llama"].pk)).content.decode()

    public_id = re.search(r'<input[^>]*name="public_id"[^>]*>', html)
    assert public_id
    assert "hx-post" not in public_id.group(0)
    assert 'hx-post="' in html  # its other fields are


def test_a_non_officer_cannot_validate(world) -> None:
    mallory = client_for("mallory")

    response = mallory.post(f"{url('tenant_new')}?validate=slug", NEWCO)

    assert response.status_code == 403
