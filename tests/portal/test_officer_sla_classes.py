"""An officer creates, edits and deletes a use case's SLA classes from its officer page.

Each change is the use case's record of the policy file with its ``sla_classes`` changed,
planned, rehearsed through ``governance.sla_classes`` (whose refusals land on the fields),
reviewed, and applied: audited, and the gateway's snapshot republished.
Personas: olivia is a governance officer; alice a developer of acme, audrey an auditor,
mallory has no role. The migrations seed the priority classes (critical … batch).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gateway.policy import VERSION_KEY
from governance.models import AuditEvent, FileRegistration, PriorityClass, SlaClass
from governance.roles import Role
from testkit.factories import make_model, make_tenant, make_use_case
from tests.portal.test_officer_support import apply, client_for, plan_cells, review, text, url

pytestmark = pytest.mark.django_db


def sla_data(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "name": "overnight",
        "description": "Transcripts by the morning",
        "kinds": ["audio", "pdf"],
        "priority_class": "batch",
        "turnaround_seconds": "",
        "windows": "mon-fri 22:00-06:00\nsat,sun 00:00-23:59",
        "time_zone": "Europe/Zurich",
        "max_file_bytes": "1048576",
    }
    data.update(changes)
    return data


@pytest.fixture
def chatbot():
    acme = make_tenant("acme")
    return make_use_case(acme, "chatbot", models=(make_model("llama"),))


@pytest.fixture
def olivia(chatbot):
    return client_for("olivia", Role.OFFICER)


@pytest.fixture
def express(chatbot):
    return SlaClass.objects.create(
        use_case=chatbot,
        name="express",
        turnaround_seconds=600,
        priority_class=PriorityClass.objects.get(name="high"),
        kinds=["text"],
    )


def test_a_new_sla_class_is_planned_then_applied_audited_and_published(
    olivia, chatbot, settings, valkey_url, valkey_client, django_capture_on_commit_callbacks
) -> None:
    settings.VALKEY_URL = valkey_url
    new_url = url("sla_class_new", chatbot.pk)
    html = review(olivia, new_url, sla_data())

    path = "use_cases[acme/chatbot].sla_classes[overnight]"
    cells = {(c.action, c.path, c.field): c.after for c in plan_cells(html)}
    assert cells == {
        ("create", path, "description"): '"Transcripts by the morning"',
        ("create", path, "kinds"): '["audio", "pdf"]',
        ("create", path, "priority_class"): '"batch"',
        ("create", path, "time_zone"): '"Europe/Zurich"',
        ("create", path, "max_file_bytes"): "1048576",
        ("create", path, "windows"): (
            '[{"days": ["mon", "tue", "wed", "thu", "fri"], "end": "06:00", "start": "22:00"}, '
            '{"days": ["sat", "sun"], "end": "23:59", "start": "00:00"}]'
        ),
    }
    assert not SlaClass.objects.exists()

    with django_capture_on_commit_callbacks(execute=True):
        response = apply(olivia, new_url, sla_data(), html)

    assert response.status_code == 302
    assert response["Location"] == url("use_case_edit", chatbot.pk) + "#sla-classes"
    created = SlaClass.objects.get(use_case=chatbot, name="overnight")
    assert created.priority_class.name == "batch"
    assert created.windows[0] == {
        "days": ["mon", "tue", "wed", "thu", "fri"],
        "start": "22:00",
        "end": "06:00",
    }
    assert list(AuditEvent.objects.values_list("action", "actor")) == [
        ("slaclass.create", "olivia")
    ]
    assert int(valkey_client.get(VERSION_KEY)) == 1


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        # governance.sla_classes' rules, with the file's paths mapped back onto the fields
        ({"windows": ""}, "turnaround_seconds", "is required without windows"),
        ({"windows": "someday 22:00-06:00"}, "windows", "unknown day(s) ['someday']"),
        ({"windows": "mon 25:00-06:00"}, "windows", "window 1 start"),
        ({"windows": "every night"}, "windows", "Line 1: write days, then hours"),
        ({"time_zone": "Mars/Olympus"}, "time_zone", "is not a time zone"),
        ({"turnaround_seconds": "30"}, "turnaround_seconds", "60"),
        ({"kinds": []}, "kinds", "at least one"),
        ({"name": "express"}, "name", "already has an SLA class called 'express'"),
        ({"name": "Not A Slug"}, "name", "lowercase"),
    ],
)
def test_an_invalid_sla_class_shows_the_error_on_its_field_and_writes_nothing(
    olivia, chatbot, express, changes, field, message
) -> None:
    response = olivia.post(
        url("sla_class_new", chatbot.pk), {**sla_data(**changes), "step": "review"}
    )

    assert response.status_code == 200
    errors = response.context["form"].errors
    assert field in errors, errors
    assert message in " ".join(errors[field])
    assert list(SlaClass.objects.values_list("name", flat=True)) == ["express"]
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_editing_a_class_shows_before_and_after(olivia, chatbot, express) -> None:
    edit_url = url("sla_class_edit", chatbot.pk, "express")
    form = olivia.get(edit_url)
    assert form.context["form"]["turnaround_seconds"].value() == 600
    data = sla_data(
        name="express",
        description="",
        kinds=["text"],
        priority_class="high",
        turnaround_seconds="300",
        windows="",
        time_zone="UTC",
        max_file_bytes=str(512 * 1024 * 1024),
    )
    html = review(olivia, edit_url, data)

    assert [(c.action, c.path, c.field, c.before, c.after) for c in plan_cells(html)] == [
        (
            "update",
            "use_cases[acme/chatbot].sla_classes[express]",
            "turnaround_seconds",
            "600",
            "300",
        )
    ]
    response = apply(olivia, edit_url, data, html)

    assert response.status_code == 302
    assert SlaClass.objects.get(pk=express.pk).turnaround_seconds == 300
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["slaclass.update"]


def test_deleting_a_class_is_reviewed_then_applied(olivia, chatbot, express) -> None:
    delete_url = url("sla_class_delete", chatbot.pk, "express")
    html = review(olivia, delete_url, {})

    cells = plan_cells(html)
    assert {(c.action, c.path) for c in cells} == {
        ("delete", "use_cases[acme/chatbot].sla_classes[express]")
    }
    assert SlaClass.objects.filter(pk=express.pk).exists()

    response = apply(olivia, delete_url, {}, html)

    assert response.status_code == 302
    assert not SlaClass.objects.filter(pk=express.pk).exists()
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["slaclass.delete"]


def test_a_class_files_use_cannot_be_deleted_and_the_page_says_why(
    olivia, chatbot, express
) -> None:
    FileRegistration.objects.create(
        use_case=chatbot,
        registered_by="alice",
        kind="text",
        filename="notes.txt",
        model=chatbot.allowed_models.get(),
        declared_bytes=10,
        sla_class=express,
        estimated_tokens=10,
        promised_by=timezone.now() + timedelta(hours=1),
    )

    response = olivia.post(url("sla_class_delete", chatbot.pk, "express"), {"step": "review"})

    assert response.status_code == 200
    assert "is used by 1 file registration(s); it cannot be deleted" in text(
        response.content.decode()
    )
    assert SlaClass.objects.filter(pk=express.pk).exists()
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_editing_the_use_case_keeps_its_sla_classes(olivia, chatbot, express) -> None:
    """The use case's form prunes what it no longer lists; its SLA classes are not on it."""
    edit_url = url("use_case_edit", chatbot.pk)
    page = olivia.get(edit_url)
    assert page.context["sla_classes"][0]["name"] == "express"
    html = page.content.decode()
    assert f'href="{url("sla_class_edit", chatbot.pk, "express")}"' in html
    assert f'href="{url("sla_class_delete", chatbot.pk, "express")}"' in html
    assert f'href="{url("sla_class_new", chatbot.pk)}"' in html
    form = page.context["form"]
    data = {name: form[name].value() for name in form.fields if form[name].value() is not None}
    data.update(
        {
            "name": "Chatbot, renamed",
            "guardrails-TOTAL_FORMS": "0",
            "guardrails-INITIAL_FORMS": "0",
            "guardrails-MIN_NUM_FORMS": "0",
            "guardrails-MAX_NUM_FORMS": "20",
        }
    )
    data["records_visible_to_developers"] = ""
    reviewed = review(olivia, edit_url, data)

    assert [(c.action, c.field) for c in plan_cells(reviewed)] == [("update", "name")]
    apply(olivia, edit_url, data, reviewed)
    assert SlaClass.objects.filter(pk=express.pk).exists()


def test_an_unknown_class_is_not_found(olivia, chatbot) -> None:
    assert olivia.get(url("sla_class_edit", chatbot.pk, "nope")).status_code == 404
    assert olivia.get(url("sla_class_delete", chatbot.pk, "nope")).status_code == 404


@pytest.mark.parametrize(
    ("username", "role"),
    [("alice", Role.DEVELOPER), ("audrey", Role.AUDITOR), ("mallory", None)],
)
def test_only_officers_may_change_sla_classes(chatbot, express, username, role) -> None:
    client = client_for(username, *([role] if role else []), tenants=(chatbot.tenant,))
    targets = [
        url("sla_class_new", chatbot.pk),
        url("sla_class_edit", chatbot.pk, "express"),
        url("sla_class_delete", chatbot.pk, "express"),
    ]
    for target in targets:
        assert client.get(target).status_code == 403
        assert client.post(target, {**sla_data(), "step": "apply"}).status_code == 403
        assert client.post(f"{target}?validate=name", sla_data()).status_code == 403
    assert list(SlaClass.objects.values_list("name", "turnaround_seconds")) == [("express", 600)]
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))
