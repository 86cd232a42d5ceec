"""A use case's async task settings in policy files (``async_tasks:``): parsed with their
bounds, planned as a change, applied through the services (audited), exported back.

Priya is the platform engineer whose CI applies the file.
"""

from __future__ import annotations

import pytest
import yaml

from governance.models import AuditEvent, UseCase
from governance.policy_as_code.export import policy_export
from governance.policy_as_code.render import plan_text
from tests.governance.test_policy_as_code import apply, plan
from tests.governance.test_policy_as_code_validation import acme_policy, problems_of

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("company_guardrails")]


def test_given_async_settings_when_planned_then_shown_applied_audited_and_exported() -> None:
    apply(acme_policy())
    data = acme_policy()
    data["use_cases"][0]["async_tasks"] = {"result_ttl_seconds": 3600, "cache_seconds": 300}
    events = AuditEvent.objects.count()

    text = plan_text(plan(data))
    apply(data)

    assert text.splitlines()[:3] == [
        "  ~ update  use_cases[acme/chatbot]",
        "        async_tasks.result_ttl_seconds: 600 → 3600",
        "        async_tasks.cache_seconds: 0 → 300",
    ]
    chatbot = UseCase.objects.get(slug="chatbot")
    assert (chatbot.async_result_ttl_seconds, chatbot.async_cache_seconds) == (3600, 300)
    (event,) = AuditEvent.objects.filter(sequence__gt=events)
    assert (event.action, event.actor) == ("usecase.update", "priya")
    assert not plan(data).has_changes
    exported = yaml.safe_load(policy_export())
    (use_case,) = [u for u in exported["use_cases"] if u["id"] == "acme/chatbot"]
    assert use_case["async_tasks"] == {"result_ttl_seconds": 3600, "cache_seconds": 300}


def test_given_the_defaults_then_the_export_says_nothing_of_them() -> None:
    apply(acme_policy())
    exported = yaml.safe_load(policy_export())
    (use_case,) = [u for u in exported["use_cases"] if u["id"] == "acme/chatbot"]
    assert "async_tasks" not in use_case


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        (
            {"result_ttl_seconds": 5},
            "use_cases[acme/chatbot].async_tasks.result_ttl_seconds: must be an integer from "
            "10 to 86400",
        ),
        (
            {"cache_seconds": 86_401},
            "use_cases[acme/chatbot].async_tasks.cache_seconds: must be an integer from 0 to 86400",
        ),
        ({"ttl": 60}, "use_cases[acme/chatbot].async_tasks: unknown field 'ttl'"),
    ],
)
def test_given_a_bad_async_setting_then_the_file_is_refused_naming_it(
    settings: dict[str, int], problem: str
) -> None:
    data = acme_policy()
    data["use_cases"][0]["async_tasks"] = settings
    assert problems_of(data) == {problem}
