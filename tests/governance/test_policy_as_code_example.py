"""The shipped example policy (a small bank) is valid, applies cleanly and round-trips."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from gateway.policy import SNAPSHOT_KEY, parse_snapshot
from governance.audit import audit_verify
from governance.choices import UseCaseStatus
from governance.models import RateLimitPolicy, Tenant, UseCase
from governance.policy_as_code.plan import document_records, plan_build
from governance.policy_as_code.schema import policy_load
from governance.policy_as_code.selectors import policy_current

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "policy" / "example.yaml"


def test_given_the_example_policy_when_validated_then_it_is_valid() -> None:
    stdout = StringIO()
    call_command("policy", "validate", str(EXAMPLE), stdout=stdout)
    assert stdout.getvalue() == f"{EXAMPLE}: valid\n"


def test_given_the_format_shown_in_the_docs_when_loaded_then_it_is_valid() -> None:
    docs = (REPO / "docs" / "policy-as-code.md").read_text()
    shown = re.search(r"## The format\n\n```yaml\n(.*?)```", docs, re.DOTALL)
    assert shown is not None
    document = policy_load(shown.group(1))
    assert document.use_cases is not None
    assert document.use_cases[0].id == "retail-assist-prod/customer-chatbot"


@pytest.mark.django_db
def test_given_the_example_policy_when_applied_then_the_bank_is_governed_and_round_trips(
    tmp_path, live_valkey_settings, valkey_client, django_capture_on_commit_callbacks
) -> None:
    stdout = StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command(
            "policy", "apply", str(EXAMPLE), "--mint-keys", "--actor", "priya", stdout=stdout
        )

    assert set(Tenant.objects.values_list("environment", flat=True)) == {"prod", "uat", "dev"}
    assert UseCase.objects.get(slug="search-sandbox").status == UseCaseStatus.SUBMITTED
    assert set(RateLimitPolicy.objects.values_list("scope", flat=True)) == {
        "global",
        "model",
        "tenant",
        "tenant_model",
    }
    assert audit_verify().ok
    snapshot = parse_snapshot(valkey_client.get(SNAPSHOT_KEY))
    assert snapshot.models["qwen3-32b-thinking"].timeout_s == 600.0
    assert snapshot.models["bge-m3"].capabilities == frozenset({"embeddings"})
    named = [p for p in snapshot.principals.values() if p.key_id is not None]
    assert (
        len(named) == 3
    )  # the three named keys, minted once (job and playground keys are derived)
    assert stdout.getvalue().count("sk-sy-") == 3

    # The file and the database now agree, and so does the database's own export.
    assert not plan_build(
        policy_load(EXAMPLE.read_text()), policy_current(), prune=True, mint_keys=True
    ).has_changes
    exported = tmp_path / "export.yaml"
    call_command("policy", "export", str(exported), stderr=StringIO())
    assert _settled(document_records(policy_load(exported.read_text()))) == document_records(
        policy_current()
    )
    held = UseCase.objects.get(slug="credit-memo-analyst")
    assert held.legal_hold
    assert held.record_policy == "full"
    assert held.record_retention_days == 2555
    assert UseCase.objects.get(slug="help-centre-search").record_policy == "none"


def _settled(records: dict) -> dict:
    """An export leaves out holds that are off, which the plan reads as "as they are": off."""
    return {
        section: None
        if rows is None
        else {
            key: {**row, "legal_hold": bool(row["legal_hold"])} if "legal_hold" in row else row
            for key, row in rows.items()
        }
        for section, rows in records.items()
    }
