"""SLA classes in policy as code: file → database → file without a spurious change, every
rule of the services checked at the class's place in the file, pruning only with --prune."""

from __future__ import annotations

from typing import Any

import pytest

from governance.audit import Actor
from governance.models import AuditEvent, SlaClass
from governance.policy_as_code.apply import policy_apply
from governance.policy_as_code.errors import PolicyInvalid
from governance.policy_as_code.export import policy_export
from governance.policy_as_code.plan import plan_build
from governance.policy_as_code.schema import policy_load, policy_parse
from governance.policy_as_code.selectors import policy_current
from tests.governance.test_policy_as_code_validation import acme_policy

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("company_guardrails")]

PRIYA = Actor(username="priya", is_system=True)
NIGHTS = {"days": ["mon", "tue", "wed", "thu", "fri"], "start": "20:00", "end": "06:00"}


def sla_policy() -> dict[str, Any]:
    data = acme_policy()
    data["use_cases"][0]["sla_classes"] = [
        {
            "name": "interactive-5m",
            "turnaround_seconds": 300,
            "priority_class": "high",
            "kinds": ["audio", "text"],
        },
        {
            "name": "overnight",
            "description": "Weekday nights",
            "windows": [NIGHTS],
            "time_zone": "Europe/Zurich",
            "priority_class": "batch",
            "max_file_bytes": 1000000,
            "kinds": ["pdf"],
        },
    ]
    return data


def plan(data: dict[str, Any], **options: Any):
    return plan_build(policy_parse(data), policy_current(), **options)


def test_apply_creates_the_classes_through_the_services_and_a_second_plan_is_empty() -> None:
    policy_apply(document=policy_parse(sla_policy()), actor=PRIYA)

    overnight = SlaClass.objects.get(name="overnight")
    assert overnight.use_case.slug == "chatbot"
    assert (overnight.turnaround_seconds, overnight.windows) == (None, [NIGHTS])
    assert (overnight.time_zone, overnight.priority_class.name) == ("Europe/Zurich", "batch")
    assert SlaClass.objects.get(name="interactive-5m").max_file_bytes == 512 * 1024 * 1024
    assert AuditEvent.objects.filter(action="slaclass.create", actor="priya").count() == 2
    assert not plan(sla_policy()).has_changes


def test_export_then_plan_is_no_change(tmp_path) -> None:
    policy_apply(document=policy_parse(sla_policy()), actor=PRIYA)
    exported = tmp_path / "export.yaml"
    exported.write_text(policy_export())

    assert "sla_classes:" in exported.read_text()
    assert not plan_build(policy_load(exported.read_text()), policy_current()).has_changes


def test_a_change_is_planned_field_by_field_and_applied() -> None:
    policy_apply(document=policy_parse(sla_policy()), actor=PRIYA)
    data = sla_policy()
    data["use_cases"][0]["sla_classes"][0]["turnaround_seconds"] = 600
    data["use_cases"][0]["sla_classes"][1]["priority_class"] = "low"

    changes = {c.path: {f.name: (f.before, f.after) for f in c.fields} for c in plan(data).changes}

    assert changes == {
        "use_cases[acme/chatbot].sla_classes[interactive-5m]": {"turnaround_seconds": (300, 600)},
        "use_cases[acme/chatbot].sla_classes[overnight]": {"priority_class": ("batch", "low")},
    }
    policy_apply(document=policy_parse(data), actor=PRIYA)
    assert SlaClass.objects.get(name="overnight").priority_class.name == "low"
    assert not plan(data).has_changes


def test_a_class_left_out_of_the_file_goes_only_with_prune() -> None:
    policy_apply(document=policy_parse(sla_policy()), actor=PRIYA)
    data = sla_policy()
    data["use_cases"][0]["sla_classes"].pop()

    kept = plan(data)
    assert not kept.has_changes
    assert "use_cases[acme/chatbot].sla_classes[overnight]" in [n.path for n in kept.notes]
    policy_apply(document=policy_parse(data), actor=PRIYA, prune=True)
    assert list(SlaClass.objects.values_list("name", flat=True)) == ["interactive-5m"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"windows": [{"days": ["mon"], "start": "20:00", "end": "6pm"}]},
            "sla_classes[overnight].windows: window 1 end '6pm' is not a time",
        ),
        ({"time_zone": "Mars/Olympus"}, "sla_classes[overnight].time_zone:"),
        ({"windows": []}, "sla_classes[overnight].turnaround_seconds: is required without"),
        ({"turnaround_seconds": 30}, "sla_classes[overnight].turnaround_seconds: must be an"),
        ({"kinds": ["video"]}, "sla_classes[overnight].kinds[0]: must be one of"),
        ({"kinds": []}, "sla_classes[overnight].kinds: must list at least one"),
        ({"max_file_bytes": 0}, "sla_classes[overnight].max_file_bytes: must be an integer"),
        ({"name": "Over Night"}, "sla_classes[Over Night].name:"),
        ({"colour": "blue"}, "sla_classes[overnight]: unknown field 'colour'"),
    ],
)
def test_a_bad_class_is_reported_at_its_place(change: dict[str, Any], expected: str) -> None:
    data = sla_policy()
    data["use_cases"][0]["sla_classes"][1].update(change)
    with pytest.raises(PolicyInvalid) as caught:
        policy_parse(data)
    problems = " | ".join(str(p) for p in caught.value.problems)
    assert expected in problems


def test_an_unknown_priority_class_is_refused_at_plan_time() -> None:
    data = sla_policy()
    data["use_cases"][0]["sla_classes"][1]["priority_class"] = "overnight-ish"
    with pytest.raises(PolicyInvalid) as caught:
        plan(data)
    assert [p.path for p in caught.value.problems] == [
        "use_cases[acme/chatbot].sla_classes[overnight].priority_class"
    ]


def test_a_name_twice_in_one_use_case_is_refused() -> None:
    data = sla_policy()
    data["use_cases"][0]["sla_classes"][1]["name"] = "interactive-5m"
    with pytest.raises(PolicyInvalid) as caught:
        policy_parse(data)
    assert "is defined twice" in " ".join(str(p) for p in caught.value.problems)
