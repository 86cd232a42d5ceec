"""A use case's guardrail selections, split when the snapshot is parsed: by stage, by where
they run, with the failure mode and the stream window; only use cases with selections are in
``Policy.guarded`` (the request path's one lookup)."""

from __future__ import annotations

import orjson
import pytest

from gateway.policy import parse_snapshot
from guardrails.protocol import CheckSpec
from testkit.policy import PolicyBuilder


def _snapshot(policy: PolicyBuilder) -> bytes:
    return orjson.dumps(
        {
            "schema": 1,
            "version": 1,
            "published_at": 0,
            "models": policy.models,
            "keys": policy.keys,
            "use_cases": policy.use_cases,
        }
    )


def test_selections_are_split_by_stage_and_by_where_they_run():
    policy = PolicyBuilder().model("m", ["http://r1"])
    alice = policy.key(use_case="rag")
    bob = policy.key(use_case="plain")
    policy.use_case_limits(bob, requests_per_minute=10)
    policy.guardrail(alice, "pii", side="both", action="redact", config={"entities": ["PERSON"]})
    policy.guardrail(alice, "prompt_injection", side="request", action="block")
    policy.guardrail(
        alice, "banned_topics", side="response", action="block", config={"model": "guard"}
    )
    policy.guardrail(alice, "toxicity", side="response", action="flag")
    parsed = parse_snapshot(_snapshot(policy))

    assert set(parsed.guarded) == {policy.use_case_id(alice)}  # bob's has none
    plan = parsed.guarded[policy.use_case_id(alice)]
    assert plan.failure == "closed"
    assert plan.request is not None
    assert plan.request.service == (
        CheckSpec("pii", "redact", {"entities": ["PERSON"]}),
        CheckSpec("prompt_injection", "block", {}),
    )
    assert plan.request.fleet == ()
    assert plan.response is not None
    assert [c.guardrail for c in plan.response.service] == ["pii", "toxicity"]
    assert [(c.guardrail, c.action) for c in plan.response.fleet] == [("banned_topics", "block")]
    assert plan.window_chars == 512  # the guard model's need, the largest of the response's


def test_request_only_selections_have_no_response_stage_and_fail_open_is_kept():
    policy = PolicyBuilder().model("m", ["http://r1"])
    alice = policy.key()
    policy.guardrail(alice, "secrets", side="request", action="block")
    policy.guardrail_failure(alice, "open")
    plan = parse_snapshot(_snapshot(policy)).guarded[policy.use_case_id(alice)]
    assert plan.response is None
    assert plan.failure == "open"


@pytest.mark.parametrize(
    ("field", "value"),
    [("side", "sideways"), ("action", "shout"), ("guardrail_failure", "maybe")],
)
def test_a_malformed_selection_makes_the_snapshot_unusable(field, value):
    """The gateway keeps its previous snapshot rather than enforce a half-understood one."""
    policy = PolicyBuilder().model("m", ["http://r1"])
    alice = policy.key()
    policy.guardrail(alice, "pii")
    use_case = policy.use_cases[str(policy.use_case_id(alice))]
    if field == "guardrail_failure":
        use_case["guardrail_failure"] = value
    else:
        use_case["guardrails"][0][field] = value  # type: ignore[literal-required]
    with pytest.raises(ValueError, match=value):
        parse_snapshot(_snapshot(policy))


def test_a_check_scoped_to_roles_reads_only_their_texts_and_an_answer_is_the_assistants():
    """GIVEN injection scoped to tool messages (where an agent's untrusted text enters) and
    PII scoped to users and the assistant, both on both sides
    WHEN the snapshot is parsed
    THEN the request stage holds one scoped group per scope, without the ``roles`` setting in
    what the service is sent; the response stage (the assistant's text) keeps PII whole and
    drops the tool-only check."""
    policy = PolicyBuilder().model("m", ["http://r1"])
    alice = policy.key()
    policy.guardrail(alice, "secrets", side="both", action="block")
    policy.guardrail(
        alice, "prompt_injection", side="both", action="block", config={"roles": ["tool"]}
    )
    policy.guardrail(
        alice, "pii", side="both", action="redact", config={"roles": ["user", "assistant"]}
    )
    plan = parse_snapshot(_snapshot(policy)).guarded[policy.use_case_id(alice)]
    assert plan.request is not None
    assert plan.request.service == (CheckSpec("secrets", "block", {}),)
    scopes = {group.roles: group.service for group in plan.request.scoped}
    assert scopes == {
        frozenset({"tool"}): (CheckSpec("prompt_injection", "block", {}),),
        frozenset({"user", "assistant"}): (CheckSpec("pii", "redact", {}),),
    }
    assert plan.response is not None
    assert plan.response.service == (
        CheckSpec("secrets", "block", {}),
        CheckSpec("pii", "redact", {}),
    )
    assert plan.response.scoped == ()
    assert plan.request.names == ["secrets", "prompt_injection", "pii"]
