"""Record settings and legal holds in policy files: parsed, planned, applied through the
services, exported back.

Priya is the platform engineer whose CI applies the file; counsel asked for Acme's hold.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from governance.audit import audit_verify
from governance.models import AuditEvent, Tenant, UseCase
from governance.policy_as_code.errors import PolicyInvalid
from governance.policy_as_code.export import policy_export
from governance.policy_as_code.plan import Action, Plan, plan_build
from governance.policy_as_code.render import plan_text
from governance.policy_as_code.schema import policy_load
from governance.policy_as_code.selectors import policy_current
from governance.selectors import legal_hold_reason
from governance.services.record_policy import use_case_set_legal_hold
from tests.governance.test_policy_as_code import PRIYA, apply, plan
from tests.governance.test_policy_as_code_validation import acme_policy, problems_of

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("company_guardrails")]


def with_records(**use_case: Any) -> dict[str, Any]:
    data = acme_policy()
    data["use_cases"][0].update(use_case)
    return data


def test_given_record_settings_when_planned_then_each_change_is_shown_and_applied_audited() -> None:
    apply(acme_policy())
    data = with_records(records={"policy": "full", "retention_days": 30})
    events = AuditEvent.objects.count()

    text = plan_text(plan(data))
    result = apply(data)

    assert text.splitlines()[:3] == [
        "  ~ update  use_cases[acme/chatbot]",
        '        records.policy: "metadata" → "full"',
        "        records.retention_days: 90 → 30",
    ]
    (change,) = result.plan.changes
    assert change.action is Action.UPDATE
    chatbot = UseCase.objects.get(slug="chatbot")
    assert (chatbot.record_policy, chatbot.record_retention_days) == ("full", 30)
    (event,) = AuditEvent.objects.filter(sequence__gt=events)
    assert (event.action, event.actor) == ("usecase.update", "priya")
    assert event.after is not None
    assert event.after["record_policy"] == "full"
    assert not plan(data).has_changes


def test_given_a_new_use_case_with_records_and_a_hold_when_applied_then_both_are_set() -> None:
    data = with_records(
        records={"policy": "none", "developers_can_read": True},
        legal_hold=True,
        legal_hold_reason="Counsel: matter 12",
    )
    data["tenants"][0].update(legal_hold=True, legal_hold_reason="Regulator inquiry R-3")

    apply(data)

    chatbot = UseCase.objects.get(slug="chatbot")
    assert chatbot.record_policy == "none"
    assert chatbot.records_visible_to_developers
    assert chatbot.legal_hold
    assert legal_hold_reason(chatbot) == "Counsel: matter 12"
    acme = Tenant.objects.get(slug="acme")
    assert acme.legal_hold
    assert legal_hold_reason(acme) == "Regulator inquiry R-3"
    assert set(
        AuditEvent.objects.filter(action__contains="legal_hold").values_list("action", "actor")
    ) == {("usecase.legal_hold_place", "priya"), ("tenant.legal_hold_place", "priya")}
    assert audit_verify().ok
    assert not plan(data).has_changes


def test_given_a_file_silent_about_a_hold_when_applied_then_the_hold_stays_and_is_noted() -> None:
    """An old file, written before the hold, must not lift it by leaving it out."""
    apply(acme_policy())
    chatbot = UseCase.objects.get(slug="chatbot")
    use_case_set_legal_hold(actor=PRIYA, use_case=chatbot, hold=True, reason="Matter 9")

    planned = plan(acme_policy())
    apply(acme_policy())

    assert not planned.has_changes
    assert (
        "use_cases[acme/chatbot]",
        "on legal hold; kept (write legal_hold: false with a legal_hold_reason to lift it)",
    ) in [(n.path, n.message) for n in planned.notes]
    assert UseCase.objects.get(slug="chatbot").legal_hold


def test_given_a_hold_lifted_in_the_file_when_applied_then_it_needs_and_records_a_reason() -> None:
    apply(with_records(legal_hold=True, legal_hold_reason="Matter 9"))

    with pytest.raises(PolicyInvalid) as refused:
        plan(with_records(legal_hold=False))
    assert [str(p) for p in refused.value.problems] == [
        "use_cases[acme/chatbot].legal_hold_reason: is required to lift a legal hold (say why)"
    ]
    apply(with_records(legal_hold=False, legal_hold_reason="Matter 9 settled"))

    assert not UseCase.objects.get(slug="chatbot").legal_hold
    lift = AuditEvent.objects.get(action="usecase.legal_hold_lift")
    assert lift.after == {"legal_hold": False, "reason": "Matter 9 settled"}


@pytest.mark.parametrize(
    ("use_case", "problem"),
    [
        (
            {"records": {"policy": "all"}},
            "use_cases[acme/chatbot].records.policy: must be one of none, metadata, full "
            "(got 'all')",
        ),
        (
            {"records": {"retention_days": 0}},
            "use_cases[acme/chatbot].records.retention_days: must be an integer from 1 to 36500",
        ),
        (
            {"records": {"developers_can_read": "yes"}},
            "use_cases[acme/chatbot].records.developers_can_read: must be true or false",
        ),
        (
            {"records": {"keep": "full"}},
            "use_cases[acme/chatbot].records: unknown field 'keep'",
        ),
        (
            {"records": "full"},
            "use_cases[acme/chatbot].records: must be a mapping",
        ),
        (
            {"legal_hold": True},
            "use_cases[acme/chatbot].legal_hold_reason: is required with legal_hold: true "
            "(say why)",
        ),
        (
            {"legal_hold_reason": "why"},
            "use_cases[acme/chatbot].legal_hold_reason: goes with legal_hold: true or false",
        ),
    ],
)
def test_given_bad_record_settings_when_validated_then_the_problem_names_its_place(
    use_case: dict[str, Any], problem: str
) -> None:
    assert problem in problems_of(with_records(**use_case))


def test_given_a_tenant_hold_without_a_reason_when_validated_then_it_is_refused() -> None:
    data = acme_policy()
    data["tenants"][0]["legal_hold"] = True
    assert "tenants[acme].legal_hold_reason: is required with legal_hold: true (say why)" in (
        problems_of(data)
    )


def test_given_records_and_holds_in_the_database_when_exported_then_the_file_plans_clean() -> None:
    data = with_records(
        records={"policy": "full", "retention_days": 400},
        legal_hold=True,
        legal_hold_reason="Matter 12",
    )
    apply(data)

    exported = policy_export()
    chatbot = next(u for u in yaml.safe_load(exported)["use_cases"] if u["id"] == "acme/chatbot")

    assert chatbot["records"] == {"policy": "full", "retention_days": 400}
    assert (chatbot["legal_hold"], chatbot["legal_hold_reason"]) == (True, "Matter 12")
    tenant = yaml.safe_load(exported)["tenants"][0]
    assert "legal_hold" not in tenant  # off: said by saying nothing
    assert not plan_from_text(exported).has_changes


def plan_from_text(text: str) -> Plan:
    return plan_build(policy_load(text), policy_current(), prune=True, mint_keys=True)
