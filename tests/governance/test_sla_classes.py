"""SLA classes: what officers may set, in words that name the field, through every door.

olivia is an officer, alice develops for acme, audrey audits.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone
from rest_framework.test import APIClient

from governance.audit import Actor
from governance.errors import Conflict
from governance.models import AuditEvent, FileRegistration, PriorityClass, SlaClass
from governance.roles import Role
from governance.sla_classes import sla_class_create, sla_class_delete, sla_class_update
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db

NIGHTS = [{"days": ["mon", "tue", "wed", "thu", "fri"], "start": "20:00", "end": "06:00"}]


@pytest.fixture
def people() -> dict[str, Any]:
    acme = make_tenant("acme")
    return {
        "acme": acme,
        "use_case": make_use_case(acme, "transcribe"),
        "olivia": make_user("olivia", Role.OFFICER),
        "alice": make_user("alice", Role.DEVELOPER, tenants=(acme,)),
        "audrey": make_user("audrey", Role.AUDITOR),
    }


def _create(people: dict[str, Any], who: str = "olivia", **fields: Any) -> SlaClass:
    values: dict[str, Any] = {"turnaround_seconds": 300, "kinds": ["audio"], **fields}
    return sla_class_create(
        actor=Actor.for_user(people[who]),
        use_case=people["use_case"],
        name=values.pop("name", "interactive"),
        priority_class=values.pop("priority_class", PriorityClass.objects.get(name="high")),
        **values,
    )


def _field_error(people: dict[str, Any], **fields: Any) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as caught:
        _create(people, **fields)
    return caught.value.message_dict


def test_an_officer_creates_a_class_and_the_audit_holds_it(people) -> None:
    sla = _create(people, windows=NIGHTS, time_zone="Europe/Zurich")
    event = AuditEvent.objects.get(action="slaclass.create")
    assert event.object_id == str(sla.pk)
    assert event.after is not None
    assert event.after["turnaround_seconds"] == 300
    assert event.tenant_slug == "acme"


def test_a_developer_may_not_create_one(people) -> None:
    with pytest.raises(PermissionDenied):
        _create(people, who="alice")
    assert not SlaClass.objects.exists()


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"windows": [{"days": ["mon"], "start": "25:00", "end": "06:00"}]}, "windows", "25:00"),
        ({"windows": [{"days": ["someday"], "start": "20:00", "end": "06:00"}]}, "windows", "day"),
        ({"windows": "nights"}, "windows", "list"),
        ({"time_zone": "Mars/Olympus"}, "time_zone", "Mars/Olympus"),
        ({"turnaround_seconds": 59}, "turnaround_seconds", "60"),
        ({"turnaround_seconds": None}, "turnaround_seconds", "windows"),
        ({"kinds": []}, "kinds", "audio"),
        ({"kinds": ["video"]}, "kinds", "video"),
        ({"kinds": ["pdf", "pdf"]}, "kinds", "once"),
        ({"max_file_bytes": 0}, "max_file_bytes", "1 byte"),
    ],
)
def test_a_bad_value_is_refused_on_its_own_field(people, fields, field, words) -> None:
    errors = _field_error(people, **fields)
    assert field in errors, errors
    assert words in " ".join(errors[field])


def test_no_turnaround_is_the_end_of_the_next_window_when_there_are_windows(people) -> None:
    sla = _create(people, turnaround_seconds=None, windows=NIGHTS)
    assert sla.turnaround_seconds is None


def test_a_name_is_unique_within_a_use_case_only(people) -> None:
    _create(people)
    assert "name" in _field_error(people)
    other = make_use_case(people["acme"], "summarise")
    sla_class_create(
        actor=Actor.for_user(people["olivia"]),
        use_case=other,
        name="interactive",
        priority_class=PriorityClass.objects.get(name="high"),
        kinds=["text"],
        turnaround_seconds=600,
    )


def test_an_update_is_validated_and_audited_with_before_and_after(people) -> None:
    sla = _create(people)
    with pytest.raises(ValidationError) as caught:
        sla_class_update(
            actor=Actor.for_user(people["olivia"]), sla_class=sla, changes={"time_zone": "Nowhere"}
        )
    assert "time_zone" in caught.value.message_dict
    sla.refresh_from_db()
    assert sla.time_zone == "UTC"
    sla_class_update(
        actor=Actor.for_user(people["olivia"]), sla_class=sla, changes={"turnaround_seconds": 900}
    )
    event = AuditEvent.objects.get(action="slaclass.update")
    assert event.before is not None
    assert event.after is not None
    assert (event.before["turnaround_seconds"], event.after["turnaround_seconds"]) == (300, 900)


def test_a_class_that_registrations_use_cannot_be_deleted(people) -> None:
    sla = _create(people)
    FileRegistration.objects.create(
        use_case=people["use_case"],
        registered_by="alice",
        kind="audio",
        filename="call.wav",
        model=make_model("whisper"),
        declared_bytes=1000,
        sla_class=sla,
        estimated_tokens=10,
        promised_by=timezone.now() + timedelta(minutes=5),
    )
    with pytest.raises(Conflict, match="used by 1 file registration"):
        sla_class_delete(actor=Actor.for_user(people["olivia"]), sla_class=sla)
    assert SlaClass.objects.filter(pk=sla.pk).exists()
    assert not AuditEvent.objects.filter(action="slaclass.delete").exists()


def test_an_unused_class_is_deleted_and_audited(people) -> None:
    sla = _create(people)
    sla_class_delete(actor=Actor.for_user(people["olivia"]), sla_class=sla)
    assert not SlaClass.objects.exists()
    assert AuditEvent.objects.get(action="slaclass.delete").before is not None


# --- the API door gives the same answers -------------------------------------------------
def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_the_api_shows_the_window_error_on_the_windows_field(people) -> None:
    response = _client(people["olivia"]).post(
        "/api/sla-classes/",
        {
            "use_case": people["use_case"].pk,
            "name": "overnight",
            "windows": [{"days": ["mon"], "start": "20:00", "end": "6pm"}],
            "priority_class": "batch",
            "kinds": ["pdf"],
        },
        format="json",
    )
    assert response.status_code == 400
    assert "6pm" in " ".join(response.json()["windows"])


def test_the_api_creates_reads_and_refuses_deleting_a_used_class(people) -> None:
    olivia = _client(people["olivia"])
    created = olivia.post(
        "/api/sla-classes/",
        {
            "use_case": people["use_case"].pk,
            "name": "overnight",
            "windows": NIGHTS,
            "time_zone": "Europe/Zurich",
            "priority_class": "batch",
            "kinds": ["pdf", "text"],
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["turnaround_seconds"] is None
    assert body["windows"] == NIGHTS
    read = _client(people["audrey"]).get(f"/api/sla-classes/{body['id']}/")
    assert read.status_code == 200
    assert read.json()["priority_class"] == "batch"
    FileRegistration.objects.create(
        use_case=people["use_case"],
        registered_by="alice",
        kind="pdf",
        filename="report.pdf",
        model=make_model("llama"),
        declared_bytes=1000,
        sla_class_id=body["id"],
        estimated_tokens=10,
        promised_by=timezone.now() + timedelta(hours=10),
    )
    refused = olivia.delete(f"/api/sla-classes/{body['id']}/")
    assert refused.status_code == 409
    assert "used by 1 file registration" in refused.json()["detail"]


def test_the_admin_shows_the_window_error_on_its_field(people, client) -> None:
    root = make_user("root", Role.ADMIN)
    root.is_staff = root.is_superuser = True
    root.save()
    client.force_login(root)
    response = client.post(
        "/admin/governance/slaclass/add/",
        {
            "use_case": people["use_case"].pk,
            "name": "overnight",
            "description": "",
            "turnaround_seconds": "",
            "windows": '[{"days": ["mon"], "start": "20:00", "end": "6pm"}]',
            "time_zone": "UTC",
            "priority_class": PriorityClass.objects.get(name="batch").pk,
            "max_file_bytes": "1000",
            "kinds": '["pdf"]',
        },
    )
    assert response.status_code == 200  # the form again, with the error
    assert "6pm" in response.content.decode()
    assert not SlaClass.objects.exists()


def test_the_admin_creates_one_through_the_services(people, client) -> None:
    root = make_user("root", Role.ADMIN)
    root.is_staff = root.is_superuser = True
    root.save()
    client.force_login(root)
    response = client.post(
        "/admin/governance/slaclass/add/",
        {
            "use_case": people["use_case"].pk,
            "name": "overnight",
            "description": "",
            "turnaround_seconds": "",
            "windows": '[{"days": ["sat", "sun"], "start": "00:00", "end": "00:00"}]',
            "time_zone": "Europe/Zurich",
            "priority_class": PriorityClass.objects.get(name="batch").pk,
            "max_file_bytes": "1000",
            "kinds": '["pdf"]',
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert SlaClass.objects.get().time_zone == "Europe/Zurich"
    assert AuditEvent.objects.filter(action="slaclass.create", actor="root").exists()


def test_the_admin_changes_one_through_the_services_with_before_and_after(people, client) -> None:
    sla = _create(people)
    root = make_user("root", Role.ADMIN)
    root.is_staff = root.is_superuser = True
    root.save()
    client.force_login(root)
    response = client.post(
        f"/admin/governance/slaclass/{sla.pk}/change/",
        {
            "use_case": people["use_case"].pk,
            "name": "interactive",
            "description": "",
            "turnaround_seconds": "900",
            "windows": "[]",
            "time_zone": "UTC",
            "priority_class": sla.priority_class_id,
            "max_file_bytes": str(sla.max_file_bytes),
            "kinds": '["audio"]',
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    event = AuditEvent.objects.get(action="slaclass.update")
    assert event.actor == "root"
    assert event.before is not None
    assert event.after is not None
    assert (event.before["turnaround_seconds"], event.after["turnaround_seconds"]) == (300, 900)


def test_file_registrations_are_read_only_in_the_admin(people, client) -> None:
    sla = _create(people)
    registration = FileRegistration.objects.create(
        use_case=people["use_case"],
        registered_by="alice",
        kind="audio",
        filename="call.wav",
        model=make_model("whisper"),
        declared_bytes=1000,
        sla_class=sla,
        estimated_tokens=10,
        promised_by=timezone.now() + timedelta(minutes=5),
    )
    root = make_user("root", Role.ADMIN)
    root.is_staff = root.is_superuser = True
    root.save()
    client.force_login(root)
    page = client.get(f"/admin/governance/fileregistration/{registration.pk}/change/")
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert client.get("/admin/governance/fileregistration/add/").status_code == 403
    refused = client.post(
        f"/admin/governance/fileregistration/{registration.pk}/change/", {"state": "done"}
    )
    assert refused.status_code == 403
    registration.refresh_from_db()
    assert registration.state == "registered"
    # ...and the class it uses offers no delete in the admin.
    assert client.get(f"/admin/governance/slaclass/{sla.pk}/delete/").status_code == 403
