"""Policy as code against the database: plan, apply, prune, lifecycle, keys, export, rollback.

Priya is the platform engineer whose CI pipeline applies the file (``--actor priya``); Acme is
the tenant whose retail chatbot the file governs.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import re
from io import StringIO
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from django.core.management import CommandError, call_command

from gateway.policy import SNAPSHOT_KEY, VERSION_KEY, parse_snapshot
from governance.audit import Actor, audit_verify
from governance.choices import ApiKeyStatus, Environment, UseCaseKind, UseCaseStatus
from governance.models import (
    ApiKey,
    AuditEvent,
    Deployment,
    GuardrailSelection,
    Model,
    PriorityClass,
    PriorityRule,
    RateLimitPolicy,
    Tenant,
    UseCase,
)
from governance.policy_as_code.apply import policy_apply
from governance.policy_as_code.errors import PolicyApplyFailed, PolicyInvalid
from governance.policy_as_code.plan import Action, plan_build
from governance.policy_as_code.schema import policy_load, policy_parse
from governance.policy_as_code.selectors import policy_current
from governance.services.generic_records import record_create
from governance.services.use_cases import use_case_create
from tests.governance.test_policy_as_code_validation import acme_policy

# A company's own guardrails (testkit/detectors.py), selected like the built-in ones.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("company_guardrails")]

PRIYA = Actor(username="priya", is_system=True)  # --actor priya
KEY_PATTERN = re.compile(r"sk-sy-[A-Za-z0-9_-]{20,}")


def write(tmp_path, data: dict[str, Any], name: str = "policy.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def run(*args: str) -> tuple[int, str]:
    """Run ``manage.py policy …``; returns (exit code, stdout)."""
    stdout = StringIO()
    try:
        call_command("policy", *args, stdout=stdout, stderr=StringIO())
    except SystemExit as exit_:
        return int(exit_.code or 0), stdout.getvalue()
    return 0, stdout.getvalue()


def apply(data: dict[str, Any], **options: bool):
    return policy_apply(document=policy_parse(data), actor=PRIYA, **options)


def plan(data: dict[str, Any], **options: Any):
    return plan_build(policy_parse(data), policy_current(), **options)


# --- plan ----------------------------------------------------------------------------------
def test_given_an_empty_database_when_planned_then_every_record_is_a_create_and_exit_is_2(
    tmp_path,
) -> None:
    path = write(tmp_path, acme_policy())

    code, out = run("plan", path)
    json_code, json_out = run("plan", path, "--json")

    assert code == json_code == 2
    assert "  + create  use_cases[acme/chatbot]" in out
    assert "        lifecycle: submit → approve" in out
    assert "Plan: 6 to create, 0 to update, 0 to delete." in out
    assert "keys[acme/chatbot:ci]: has no active key (apply --mint-keys mints one)" in out
    document = orjson.loads(json_out)
    assert document["has_changes"] is True
    assert document["summary"] == {"create": 6, "update": 0, "delete": 0, "retire": 0, "mint": 0}
    assert [(c["action"], c["path"]) for c in document["changes"]] == [
        ("create", "models[llama]"),
        ("create", "models[llama].deployments[llama-8b]"),
        ("create", "tenants[acme]"),
        ("create", "use_cases[acme/chatbot]"),
        ("create", "use_cases[acme/chatbot].guardrails[request:wordlist]"),
        ("create", "rate_limits[fleet]"),
    ]
    chatbot = document["changes"][3]
    assert chatbot["fields"]["limits.tokens_per_minute"] == {"before": None, "after": 1000}
    assert chatbot["transitions"] == ["submit", "approve"]
    assert Tenant.objects.count() == 0  # planning writes nothing


def test_given_a_file_matching_the_seeded_matrix_when_planned_then_exit_is_0(tmp_path) -> None:
    exported = tmp_path / "seeded.yaml"
    call_command("policy", "export", str(exported), stderr=StringIO())

    code, out = run("plan", str(exported))

    assert code == 0
    assert out == "No changes: the database matches the file.\n"


# --- apply ---------------------------------------------------------------------------------
def test_given_acme_policy_when_applied_then_records_exist_audited_and_published_once(
    tmp_path, live_valkey_settings, valkey_client, django_capture_on_commit_callbacks
) -> None:
    path = write(tmp_path, acme_policy())

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        code, out = run("apply", path, "--actor", "priya")

    assert code == 0
    assert "Applied 6 change(s) as priya." in out
    chatbot = UseCase.objects.get(tenant__slug="acme", slug="chatbot")
    assert chatbot.status == UseCaseStatus.APPROVED
    assert chatbot.tokens_per_minute == 1000
    assert [m.public_id for m in chatbot.allowed_models.all()] == ["llama"]
    assert chatbot.guardrails.get().action == "redact"
    assert Deployment.objects.get().replicas == ["http://10.0.0.1:8000"]
    assert RateLimitPolicy.objects.get().requests_per_minute == 100
    # Every write went through the services: audited by priya, in one unbroken chain …
    actions = list(AuditEvent.objects.values_list("action", flat=True))
    assert actions == [
        "model.create",
        "deployment.create",
        "tenant.create",
        "usecase.create",
        "guardrailselection.create",
        "usecase.submit",
        "usecase.approve",
        "ratelimitpolicy.create",
    ]
    assert set(AuditEvent.objects.values_list("actor", flat=True)) == {"priya"}
    assert audit_verify().ok
    # … and the gateway's snapshot was republished once, for the whole apply.
    assert len(callbacks) == 1
    assert int(valkey_client.get(VERSION_KEY)) == 1
    snapshot = parse_snapshot(valkey_client.get(SNAPSHOT_KEY))
    assert snapshot.models["llama"].served_name == "llama-8b"


def test_given_an_applied_policy_when_applied_again_then_nothing_is_written(
    tmp_path, django_capture_on_commit_callbacks
) -> None:
    path = write(tmp_path, acme_policy())
    run("apply", path)
    events = AuditEvent.objects.count()

    with django_capture_on_commit_callbacks() as callbacks:
        code, out = run("apply", path)
    plan_code, _ = run("plan", path)

    assert code == 0
    assert "No changes: the database matches the file." in out
    assert AuditEvent.objects.count() == events
    assert callbacks == []  # no republish either
    assert plan_code == 0


def test_given_one_changed_limit_when_planned_then_exactly_that_change_is_shown(tmp_path) -> None:
    apply(acme_policy())
    data = acme_policy()
    data["use_cases"][0]["limits"]["tokens_per_minute"] = 2000
    events = AuditEvent.objects.count()

    code, out = run("plan", write(tmp_path, data))
    result = apply(data)

    assert code == 2
    assert out.splitlines()[:2] == [
        "  ~ update  use_cases[acme/chatbot]",
        "        limits.tokens_per_minute: 1000 → 2000",
    ]
    (change,) = result.plan.changes
    assert (change.action, change.path) == (Action.UPDATE, "use_cases[acme/chatbot]")
    assert [(f.name, f.before, f.after) for f in change.fields] == [
        ("limits.tokens_per_minute", 1000, 2000)
    ]
    assert change.transitions == ()
    (event,) = AuditEvent.objects.filter(sequence__gt=events)
    assert event.action == "usecase.update"
    assert event.before is not None
    assert event.after is not None
    assert (event.before["tokens_per_minute"], event.after["tokens_per_minute"]) == (1000, 2000)


def test_given_reordered_lists_when_planned_then_nothing_changes() -> None:
    data = acme_policy()
    data["models"][0]["capabilities"] = ["completions", "chat"]
    apply(data)
    data["models"][0]["capabilities"] = ["chat", "completions"]
    assert not plan(data).has_changes


# --- prune ---------------------------------------------------------------------------------
def globex_policy() -> dict[str, Any]:
    """Acme's policy plus Globex (a tenant with no use cases), Acme's second use case, a tenant
    rate limit and a response guardrail: all of which a later file may leave out."""
    data = acme_policy()
    globex = copy.deepcopy(data["tenants"][0]) | {"id": "globex", "application_id": "APP-2000"}
    data["tenants"].append(globex)
    data["rate_limits"].append(
        {"name": "acme", "scope": "tenant", "tenant": "acme", "tokens_per_minute": 5000}
    )
    data["use_cases"][0]["guardrails"].append(
        {"guardrail": "prompt_length", "side": "request", "action": "block"}
    )
    data["use_cases"].append(
        copy.deepcopy(data["use_cases"][0]) | {"id": "acme/summaries", "name": "Summaries"}
    )
    return data


def test_given_records_missing_from_the_file_when_applied_without_prune_then_they_are_kept(
    tmp_path,
) -> None:
    apply(globex_policy())
    events = AuditEvent.objects.count()
    path = write(tmp_path, acme_policy())

    code, out = run("plan", path)
    result = apply(acme_policy())

    assert code == 0  # without --prune there is nothing apply would do
    assert not result.plan.has_changes
    assert [(n.path, n.message) for n in result.plan.notes] == [
        ("keys[acme/chatbot:ci]", "has no active key (apply --mint-keys mints one)"),
        ("rate_limits[acme]", "not in the file; kept (apply --prune deletes it)"),
        ("tenants[globex]", "not in the file; kept (apply --prune deletes it)"),
        (
            "use_cases[acme/chatbot].guardrails[request:prompt_length]",
            "not in the file; kept (apply --prune deletes it)",
        ),
        ("use_cases[acme/summaries]", "not in the file; kept (apply --prune retires it)"),
    ]
    assert "Left as they are:" in out
    assert AuditEvent.objects.count() == events
    assert Tenant.objects.filter(slug="globex").exists()


def test_given_records_missing_from_the_file_when_applied_with_prune_then_they_go(
    tmp_path,
) -> None:
    apply(globex_policy())
    events = AuditEvent.objects.count()
    path = write(tmp_path, acme_policy())

    code, out = run("plan", path, "--prune")
    run("apply", path, "--prune")

    assert code == 2
    assert "  - retire  use_cases[acme/summaries]" in out
    assert not Tenant.objects.filter(slug="globex").exists()
    assert not RateLimitPolicy.objects.filter(name="acme").exists()
    assert not GuardrailSelection.objects.filter(
        use_case__slug="chatbot", guardrail="prompt_length"
    ).exists()
    # Use cases are never deleted: pruning retires them, and they keep their history.
    assert UseCase.objects.get(slug="summaries").status == UseCaseStatus.RETIRED
    assert sorted(
        AuditEvent.objects.filter(sequence__gt=events).values_list("action", flat=True)
    ) == [
        "guardrailselection.delete",
        "ratelimitpolicy.delete",
        "tenant.delete",
        "usecase.retire",
    ]
    assert audit_verify().ok
    assert run("plan", path, "--prune")[0] == 0


def test_given_a_section_left_out_when_pruned_then_that_section_is_untouched() -> None:
    apply(acme_policy())
    only_rate_limits = {"version": 1, "rate_limits": []}

    result = apply(only_rate_limits, prune=True)

    assert [c.path for c in result.plan.changes] == ["rate_limits[fleet]"]
    assert Model.objects.filter(public_id="llama").exists()
    assert PriorityRule.objects.count() == 24  # the seeded matrix, not in this file


def test_given_a_model_dropped_from_the_file_when_pruned_then_use_cases_let_go_of_it() -> None:
    data = acme_policy()
    data["models"].append({"id": "qwen", "capabilities": ["chat"]})
    data["use_cases"][0]["models"] = ["llama", "qwen"]
    apply(data)
    without_use_cases = acme_policy()
    del without_use_cases["use_cases"], without_use_cases["keys"]

    result = apply(without_use_cases, prune=True)

    assert [(c.action, c.path) for c in result.plan.changes] == [
        (Action.DELETE, "models[qwen]"),
        (Action.UPDATE, "use_cases[acme/chatbot]"),
    ]
    chatbot = UseCase.objects.get(slug="chatbot")
    assert [m.public_id for m in chatbot.allowed_models.all()] == ["llama"]
    assert AuditEvent.objects.filter(action="usecase.update").count() == 1


# --- lifecycle -----------------------------------------------------------------------------
def test_given_status_changes_when_applied_then_they_follow_the_lifecycle_with_reasons() -> None:
    data = acme_policy()
    data["use_cases"][0]["status"] = "draft"
    apply(data)
    chatbot = UseCase.objects.get(slug="chatbot")
    assert chatbot.status == UseCaseStatus.DRAFT

    data["use_cases"][0]["status"] = "suspended"
    data["use_cases"][0]["status_reason"] = "INC-4411: leaked account numbers"
    suspended = apply(data)
    data["use_cases"][0]["status"] = "approved"
    del data["use_cases"][0]["status_reason"]
    reinstated = apply(data)

    assert suspended.plan.changes[0].transitions == ("submit", "approve", "suspend")
    assert reinstated.plan.changes[0].transitions == ("reinstate",)
    chatbot.refresh_from_db()
    assert chatbot.status == UseCaseStatus.APPROVED
    suspend = AuditEvent.objects.get(action="usecase.suspend")
    assert suspend.after == {"status": "suspended", "reason": "INC-4411: leaked account numbers"}
    assert list(
        AuditEvent.objects.filter(action__startswith="usecase.").values_list("action", flat=True)
    ) == [
        "usecase.create",
        "usecase.submit",
        "usecase.approve",
        "usecase.suspend",
        "usecase.reinstate",
    ]


def test_given_a_status_no_transition_reaches_when_planned_then_it_is_refused() -> None:
    apply(acme_policy())
    data = acme_policy()
    data["use_cases"][0]["status"] = "draft"

    with pytest.raises(PolicyInvalid) as caught:
        apply(data)

    assert [str(p) for p in caught.value.problems] == [
        "use_cases[acme/chatbot].status: cannot go from approved to draft: use cases move "
        "draft → submitted → approved ⇄ suspended, back to draft only when rejected, and stay "
        "retired"
    ]


# --- keys ----------------------------------------------------------------------------------
def test_given_named_keys_when_minted_then_each_secret_is_printed_once_and_never_logged(
    tmp_path, caplog, live_valkey_settings, valkey_client, django_capture_on_commit_callbacks
) -> None:
    caplog.set_level(logging.DEBUG)
    data = acme_policy()
    data["keys"].append({"use_case": "acme/chatbot", "name": "batch-jobs"})
    path = write(tmp_path, data)

    with django_capture_on_commit_callbacks(execute=True):
        code, out = run("apply", path, "--mint-keys")
    again_code, again = run("apply", path, "--mint-keys")

    secrets = KEY_PATTERN.findall(out)
    assert code == again_code == 0
    assert len(secrets) == len(set(secrets)) == 2
    assert {hashlib.sha256(s.encode()).hexdigest() for s in secrets} == set(
        ApiKey.objects.filter(status=ApiKeyStatus.ACTIVE).values_list("key_hash", flat=True)
    )
    assert set(ApiKey.objects.values_list("name", flat=True)) == {"ci", "batch-jobs"}
    for secret in secrets:
        assert out.count(secret) == 1
        assert secret not in caplog.text
        assert secret not in str(list(AuditEvent.objects.values_list("before", "after")))
    # The gateway honours the new keys.
    snapshot = parse_snapshot(valkey_client.get(SNAPSHOT_KEY))
    for secret in secrets:
        principal = snapshot.principal_for(hashlib.sha256(secret.encode()).hexdigest())
        assert principal is not None
        assert (principal.tenant, principal.use_case) == ("acme", "chatbot")
    # Nothing is minted twice: both names already have an active key.
    assert KEY_PATTERN.findall(again) == []
    assert ApiKey.objects.count() == 2


def test_given_a_revoked_key_when_minting_then_a_new_one_replaces_it() -> None:
    apply(acme_policy(), mint_keys=True)
    ApiKey.objects.update(status=ApiKeyStatus.REVOKED)

    result = apply(acme_policy(), mint_keys=True)

    assert [(c.action, c.path) for c in result.plan.changes] == [
        (Action.MINT, "keys[acme/chatbot:ci]")
    ]
    assert len(result.minted) == 1
    assert result.minted[0].plaintext not in repr(result.minted[0])


# --- export --------------------------------------------------------------------------------
def test_given_records_made_through_the_portal_when_exported_then_planning_the_export_is_clean(
    tmp_path,
) -> None:
    apply(globex_policy(), mint_keys=True)
    # Records made by hand (portal, admin) rather than by a file: a draft use case with a
    # configured guardrail, a multi-line purpose and no limits.
    globex = Tenant.objects.get(slug="globex")
    draft = use_case_create(
        actor=Actor.system("portal"),
        tenant=globex,
        fields={
            "slug": "kyc",
            "name": "KYC extraction",
            "kind": UseCaseKind.EXTRACTION,
            "purpose": "Reads passports.\nKeeps nothing.",
        },
        allowed_models=Model.objects.all(),
    )
    record_create(
        actor=Actor.system("portal"),
        instance=GuardrailSelection(
            use_case=draft,
            guardrail="wordlist",
            side="response",
            action="flag",
            config={"words": ["tax advice"], "case_sensitive": True},
        ),
    )
    exported = tmp_path / "export.yaml"

    call_command("policy", "export", str(exported), stderr=StringIO())
    code, out = run("plan", str(exported), "--prune", "--mint-keys")

    assert (code, out) == (0, "No changes: the database matches the file.\n")
    text = exported.read_text()
    assert "sk-sy-" not in text
    assert "key_hash" not in text
    assert "  - {use_case: acme/chatbot, name: ci}" in text
    assert "    purpose: |-\n      Reads passports.\n      Keeps nothing.\n" in text
    # Stable: exporting twice writes the same bytes.
    stdout = StringIO()
    call_command("policy", "export", stdout=stdout)
    assert stdout.getvalue() == text


# --- failures roll everything back ----------------------------------------------------------
def test_given_a_rank_clash_found_while_applying_then_nothing_is_written(
    live_valkey_settings, valkey_client, django_capture_on_commit_callbacks
) -> None:
    data = acme_policy()
    # "critical" holds rank 0 in the database; the file neither lists it nor prunes it, so
    # the clash is only found by the service's own validation, after the records before it.
    data["priority_classes"] = [{"name": "urgent", "rank": 0, "vllm_priority": 0}]
    events = AuditEvent.objects.count()

    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(PolicyApplyFailed) as caught,
    ):
        apply(data)

    assert [str(p) for p in caught.value.problems] == [
        "priority_classes[urgent]: rank: Priority class with this Rank already exists."
    ]
    assert Tenant.objects.count() == Model.objects.count() == UseCase.objects.count() == 0
    assert AuditEvent.objects.count() == events
    assert callbacks == []
    assert valkey_client.get(VERSION_KEY) is None
    assert audit_verify().ok


def test_given_a_reference_only_the_database_could_hold_when_applying_then_it_is_refused(
    tmp_path,
) -> None:
    data = acme_policy()
    del data["models"]  # so the use case's models are looked up in the database

    stderr = StringIO()
    with pytest.raises(CommandError, match="1 problem in") as caught:
        call_command("policy", "apply", write(tmp_path, data), stderr=stderr, stdout=StringIO())

    assert caught.value.returncode == 1
    assert (
        "use_cases[acme/chatbot].models[0]: unknown model 'llama' (not defined in the file, nor "
        "in the database for a section the file leaves out)"
    ) in stderr.getvalue()
    assert Tenant.objects.count() == 0


def test_given_two_classes_swapping_ranks_when_applied_then_both_move() -> None:
    current = {pc.name: pc.rank for pc in PriorityClass.objects.all()}
    classes = [
        {"name": name, "rank": rank, "vllm_priority": rank} for name, rank in current.items()
    ]
    for entry in classes:
        if entry["name"] == "high":
            entry["rank"] = current["standard"]
        elif entry["name"] == "standard":
            entry["rank"] = current["high"]

    apply({"version": 1, "priority_classes": classes})

    assert PriorityClass.objects.get(name="high").rank == current["standard"]
    assert PriorityClass.objects.get(name="standard").rank == current["high"]
    assert not plan({"version": 1, "priority_classes": classes}).has_changes


def test_given_a_new_priority_matrix_cell_when_applied_then_the_rule_points_at_its_class() -> None:
    data = {"version": 1, "priority_matrix": {"prod": {"qa": "standard"}}}

    result = apply(data)

    assert [(c.action, c.path) for c in result.plan.changes] == [
        (Action.UPDATE, "priority_matrix.prod.qa")
    ]
    rule = PriorityRule.objects.get(environment=Environment.PROD, namespace="qa")
    assert rule.priority_class.name == "standard"


def test_given_a_file_when_loaded_from_text_then_it_equals_the_parsed_data(tmp_path) -> None:
    path = write(tmp_path, acme_policy())
    assert policy_load(Path(path).read_text()) == policy_parse(acme_policy())
