from __future__ import annotations

import hashlib

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from governance.choices import ApiKeyStatus
from governance.models import ApiKey, Deployment, PriorityRule, SlaClass, UseCase
from ops.demo import FleetModel, demo_seed, parse_fleet_arg

pytestmark = pytest.mark.django_db

FLEET = [
    FleetModel(
        "llama", ["chat", "completions"], ["http://127.0.0.1:8101", "http://127.0.0.1:8102"]
    ),
    FleetModel("embed", ["embeddings"], ["http://127.0.0.1:8103"]),
]


def test_seeding_twice_refreshes_in_place_and_only_the_newest_demo_key_works(
    live_valkey_settings,
) -> None:
    first = demo_seed(fleet=FLEET, admin_password="pw-one-123")
    moved = [FleetModel("llama", ["chat"], ["http://127.0.0.1:9101"]), FLEET[1]]
    second = demo_seed(fleet=moved, admin_password="pw-two-456")

    assert first.key_plaintext != second.key_plaintext
    statuses = {key.key_hash: key.status for key in ApiKey.objects.all()}
    assert statuses == {
        hashlib.sha256(first.key_plaintext.encode()).hexdigest(): ApiKeyStatus.REVOKED,
        hashlib.sha256(second.key_plaintext.encode()).hexdigest(): ApiKeyStatus.ACTIVE,
    }
    assert UseCase.objects.count() == 2
    assert Deployment.objects.get(model__public_id="llama").replicas == ["http://127.0.0.1:9101"]
    # The admin is created once; the second run does not reset (or reveal) its password.
    assert first.admin_password == "pw-one-123"
    assert second.admin_password is None
    assert get_user_model().objects.get(username="admin").check_password("pw-one-123")


@pytest.mark.parametrize(
    "bad", ["llama", "llama=chat", "=chat=http://x", "llama==http://x", "llama=chat="]
)
def test_a_malformed_fleet_argument_is_refused_clearly(bad: str) -> None:
    with pytest.raises(ValueError, match="--model"):
        parse_fleet_arg(bad)


def test_the_command_refuses_in_production_mode(settings) -> None:
    settings.PRODUCTION = True
    with pytest.raises(CommandError, match="embedded demo only"):
        call_command("seed_demo", "--model", "a=chat=http://127.0.0.1:1")


def test_the_command_rejects_a_bad_replica_url(live_valkey_settings) -> None:
    with pytest.raises(CommandError, match="http"):
        call_command("seed_demo", "--model", "a=chat=ftp://127.0.0.1:1")


def test_the_demo_use_case_shows_guardrails_at_work_and_cannot_call_the_guard_model(
    live_valkey_settings,
) -> None:
    """GIVEN a fleet with a guard model WHEN the demo is seeded twice THEN its use case has the
    demo's guardrails once each (denied topics judged by that guard model), and the guard
    model is not among the models its key may call."""
    fleet = [*FLEET, FleetModel("guard", ["guard"], ["http://127.0.0.1:8104"])]
    demo_seed(fleet=fleet, admin_password="pw-one-123")
    demo_seed(fleet=fleet, admin_password="pw-one-123")

    use_case = UseCase.objects.get(slug="demo-assistant")
    selections = list(use_case.guardrails.order_by("position"))
    assert [(s.guardrail, s.side, s.action) for s in selections] == [
        ("secrets", "request", "block"),
        ("invisible_text", "request", "redact"),
        ("pii", "request", "redact"),
        ("prompt_injection", "request", "flag"),
        ("toxicity", "response", "flag"),
        ("banned_topics", "both", "flag"),
    ]
    assert selections[-1].config["model"] == "guard"
    assert sorted(m.public_id for m in use_case.allowed_models.all()) == ["embed", "llama"]


def test_the_demo_assistant_records_in_full_and_the_embeddings_use_case_metadata_only(
    live_valkey_settings,
) -> None:
    """GIVEN the demo seeded WHEN an officer turned the assistant's recording down and the demo
    is seeded again THEN the assistant records in full again (the demo shows transcripts) and
    the second demo use case, approved, keeps metadata only."""
    demo_seed(fleet=FLEET, admin_password="pw-one-123")
    UseCase.objects.filter(slug="demo-assistant").update(record_policy="none")
    demo_seed(fleet=FLEET, admin_password="pw-one-123")

    policies = dict(UseCase.objects.values_list("slug", "record_policy"))
    assert policies == {"demo-assistant": "full", "demo-embeddings": "metadata"}
    embeddings = UseCase.objects.get(slug="demo-embeddings")
    assert embeddings.status == "approved"
    assert [m.public_id for m in embeddings.allowed_models.all()] == ["embed"]


def test_the_demo_assistant_has_interactive_overnight_and_daily_batch_sla_classes(
    live_valkey_settings,
) -> None:
    """Seeded once, however often ``make up`` runs: the second seed adds no second copy."""
    demo_seed(fleet=FLEET, admin_password="pw-one-123")
    demo_seed(fleet=FLEET, admin_password="pw-one-123")
    classes = {sla.name: sla for sla in SlaClass.objects.filter(use_case__slug="demo-assistant")}
    assert sorted(classes) == ["batch-24h", "interactive-5m", "overnight"]
    interactive, overnight = classes["interactive-5m"], classes["overnight"]
    daily = classes["batch-24h"]  # what the OpenAI Batch API's "24h" window maps to
    assert (daily.turnaround_seconds, daily.kinds) == (24 * 3600, ["batch"])
    assert daily.priority_class.name == "batch"
    assert (interactive.turnaround_seconds, interactive.windows) == (300, [])
    assert interactive.kinds == ["audio", "text"]
    prod_rule = PriorityRule.objects.get(environment="prod", namespace="prod")
    assert interactive.priority_class == prod_rule.priority_class
    assert overnight.turnaround_seconds is None
    assert overnight.time_zone == "Europe/Zurich"
    assert overnight.priority_class.name == "batch"
    assert overnight.kinds == ["pdf", "text", "batch"]
    assert {w["start"] for w in overnight.windows} == {"20:00", "00:00"}
