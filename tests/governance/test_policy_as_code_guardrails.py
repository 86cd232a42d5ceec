"""Guardrails in policy as code: their order, their complete settings and the failure mode
go from file to database and back without a spurious change; bad ones are refused in place."""

from __future__ import annotations

from itertools import permutations
from typing import Any

import pytest

from governance.audit import Actor
from governance.models import GuardrailSelection, UseCase
from governance.policy_as_code.apply import policy_apply
from governance.policy_as_code.errors import PolicyApplyFailed, PolicyInvalid
from governance.policy_as_code.export import policy_export
from governance.policy_as_code.plan import plan_build
from governance.policy_as_code.schema import policy_load, policy_parse
from governance.policy_as_code.selectors import policy_current
from tests.governance.test_policy_as_code_validation import acme_policy

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("company_guardrails")]

PRIYA = Actor(username="priya", is_system=True)


def guarded_policy() -> dict[str, Any]:
    data = acme_policy()
    data["use_cases"][0]["guardrail_failure"] = "open"
    data["use_cases"][0]["guardrails"] = [
        {"guardrail": "prompt_length", "side": "request", "action": "block"},
        {"guardrail": "wordlist", "side": "both", "action": "redact", "config": {"words": ["x"]}},
    ]
    return data


def plan(data: dict[str, Any]):
    return plan_build(policy_parse(data), policy_current())


def test_the_file_order_is_the_run_order_and_settings_are_stored_complete() -> None:
    policy_apply(document=policy_parse(guarded_policy()), actor=PRIYA)

    chatbot = UseCase.objects.get(slug="chatbot")
    assert chatbot.guardrail_failure == "open"
    rows = list(GuardrailSelection.objects.filter(use_case=chatbot).order_by("position"))
    assert [(g.guardrail, g.position, g.config) for g in rows] == [
        ("prompt_length", 0, {"max_chars": 4000}),
        ("wordlist", 1, {"words": ["x"], "case_sensitive": False}),
    ]
    # Defaults the file left out are not a change: the file's settings are completed too.
    assert not plan(guarded_policy()).has_changes


def test_export_then_apply_is_no_change_and_keeps_order_and_failure_mode(tmp_path) -> None:
    policy_apply(document=policy_parse(guarded_policy()), actor=PRIYA)
    exported = tmp_path / "export.yaml"
    exported.write_text(policy_export())

    document = policy_load(exported.read_text())
    assert not plan_build(document, policy_current()).has_changes
    text = exported.read_text()
    assert "guardrail_failure: open" in text
    assert text.index("guardrail: prompt_length") < text.index("guardrail: wordlist")


def test_a_plan_shows_a_reorder_a_new_mode_and_the_failure_mode() -> None:
    policy_apply(document=policy_parse(guarded_policy()), actor=PRIYA)
    data = guarded_policy()
    data["use_cases"][0]["guardrails"].reverse()
    data["use_cases"][0]["guardrails"][0]["action"] = "flag"
    data["use_cases"][0]["guardrail_failure"] = "closed"

    changes = {c.path: {f.name: (f.before, f.after) for f in c.fields} for c in plan(data).changes}

    assert changes["use_cases[acme/chatbot]"]["guardrail_failure"] == ("open", "closed")
    assert changes["use_cases[acme/chatbot].guardrails[both:wordlist]"] == {
        "action": ("redact", "flag"),
        "position": (1, 0),
    }
    assert changes["use_cases[acme/chatbot].guardrails[request:prompt_length]"] == {
        "position": (0, 1)
    }
    policy_apply(document=policy_parse(data), actor=PRIYA)
    assert not plan(data).has_changes


@pytest.mark.parametrize(
    ("guardrail", "expected"),
    [
        (
            {"guardrail": "nope", "side": "request", "action": "block"},
            "guardrails[request:nope].guardrail: must be one of",
        ),
        (
            {"guardrail": "prompt_length", "side": "response", "action": "block"},
            "guardrails[response:prompt_length].side: prompt_length runs on request only",
        ),
        (
            {"guardrail": "prompt_length", "side": "request", "action": "redact"},
            "guardrails[request:prompt_length].action: prompt_length cannot redact",
        ),
        (
            {"guardrail": "wordlist", "side": "request", "action": "flag", "config": {}},
            "guardrails[request:wordlist].config: words: give a non-empty list of words.",
        ),
        (
            {"guardrail": "wordlist", "side": "response", "action": "flag", "config": {"w": 1}},
            "guardrails[response:wordlist].side: wordlist is already selected on one of",
        ),
    ],
)
def test_a_bad_guardrail_in_a_file_is_reported_at_its_place(guardrail, expected) -> None:
    data = guarded_policy()
    data["use_cases"][0]["guardrails"].append(guardrail)
    with pytest.raises(PolicyInvalid) as caught:
        policy_parse(data)
    problems = " | ".join(str(p) for p in caught.value.problems)
    assert expected in problems


def test_an_unknown_failure_mode_is_refused() -> None:
    data = guarded_policy()
    data["use_cases"][0]["guardrail_failure"] = "ajar"
    with pytest.raises(PolicyInvalid) as caught:
        policy_parse(data)
    assert [str(p) for p in caught.value.problems] == [
        "use_cases[acme/chatbot].guardrail_failure: must be one of closed, open (got 'ajar')"
    ]


def test_any_new_order_in_the_file_is_the_order_after_one_apply() -> None:
    """GIVEN five guardrails applied WHEN the file puts them in another order THEN one apply
    leaves exactly the file's order, and a second plan has nothing to do."""
    length = {"guardrail": "prompt_length", "side": "request", "action": "block"}
    asks = {
        "guardrail": "wordlist",
        "side": "request",
        "action": "flag",
        "config": {"words": ["a"]},
    }
    says = {
        "guardrail": "wordlist",
        "side": "response",
        "action": "flag",
        "config": {"words": ["b"]},
    }
    loud_in = {"guardrail": "shouting", "side": "request", "action": "flag"}
    loud_out = {"guardrail": "shouting", "side": "response", "action": "block"}
    data = guarded_policy()
    five: list[dict[str, Any]] = [length, asks, says, loud_in, loud_out]
    data["use_cases"][0]["guardrails"] = five
    policy_apply(document=policy_parse(data), actor=PRIYA)

    # Every order of the five, one after the other: each apply starts from the last order.
    for order in (list(p) for p in permutations(five)):
        data["use_cases"][0]["guardrails"] = order
        policy_apply(document=policy_parse(data), actor=PRIYA)

        rows = GuardrailSelection.objects.filter(use_case__slug="chatbot").order_by("position")
        assert [(g.guardrail, g.side, g.position) for g in rows] == [
            (item["guardrail"], item["side"], index) for index, item in enumerate(order)
        ]
        assert not plan(data).has_changes


def test_a_guardrail_moved_to_another_stage_in_the_file_applies_in_one_go() -> None:
    """GIVEN the word list on requests WHEN the file selects it on both stages instead THEN
    without --prune the old selection is kept and the clash is refused, naming it; with
    --prune apply removes the one before adding the other."""
    data = guarded_policy()
    data["use_cases"][0]["guardrails"][1]["side"] = "request"
    policy_apply(document=policy_parse(data), actor=PRIYA)
    data["use_cases"][0]["guardrails"][1]["side"] = "both"

    with pytest.raises(PolicyApplyFailed) as refused:
        policy_apply(document=policy_parse(data), actor=PRIYA)
    assert "guardrails[both:wordlist]: guardrail: 'wordlist' is already selected on request" in (
        str(refused.value.problems[0])
    )
    policy_apply(document=policy_parse(data), actor=PRIYA, prune=True)

    rows = GuardrailSelection.objects.filter(use_case__slug="chatbot").order_by("position")
    assert [(g.guardrail, g.side) for g in rows] == [
        ("prompt_length", "request"),
        ("wordlist", "both"),
    ]
    assert not plan(data).has_changes
