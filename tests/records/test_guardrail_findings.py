"""Guardrail findings, from the gateway's ``sy:guardrails`` stream into the database: one row
per finding, counted per use case × guardrail × action × hour, exactly once, through a real
Valkey and a real Celery worker."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
import valkey

from gateway.accounting import GUARDRAIL_FIELDS, GUARDRAILS_STREAM
from ops.processes import ManagedProcess, wait_until
from records.models import GuardrailFinding, GuardrailHour
from records.usage import GROUP, usage_persist
from runtime.valkey_urls import for_kombu
from testkit.factories import make_tenant, make_use_case

pytestmark = pytest.mark.django_db

AT_1402 = datetime(2025, 3, 4, 14, 2, 5, tzinfo=UTC)
HOUR_14 = datetime(2025, 3, 4, 14, tzinfo=UTC)
HOUR_15 = datetime(2025, 3, 4, 15, tzinfo=UTC)


def ms(at: datetime, plus_s: float = 0) -> int:
    return int(at.timestamp() * 1000 + plus_s * 1000)


def add_finding(client: valkey.Valkey, **values: object) -> bytes:
    """One entry as the gateway writes it (its GUARDRAIL_FIELDS schema)."""
    fields: dict[str, object] = dict.fromkeys(GUARDRAIL_FIELDS, "")
    fields.update(
        request_id="req-1",
        at_ms=ms(AT_1402),
        tenant="acme",
        use_case_id=7,
        key_id=11,
        model="llama-test",
        stage="request",
        guardrail="pii",
        action="redacted",
        entities=orjson.dumps({"EMAIL_ADDRESS": 2, "PERSON": 1}).decode(),
        score=0.85,
        policy_version=4,
    )
    fields.update(values)
    entry_id: Any = client.xadd(GUARDRAILS_STREAM, {k: str(v) for k, v in fields.items()})
    return entry_id


def pending(client: valkey.Valkey) -> int:
    summary: Any = client.xpending(GUARDRAILS_STREAM, GROUP)
    return int(summary["pending"])


def hours() -> dict[tuple[int, str, str, datetime], int]:
    return {
        (row.use_case_id, row.guardrail, row.action, row.hour): row.findings
        for row in GuardrailHour.objects.all()
    }


def test_findings_are_stored_without_text_and_counted_per_hour(
    valkey_client: valkey.Valkey,
) -> None:
    """GIVEN findings of two guardrails across two hours WHEN the persister runs THEN each is a
    row with its entity counts and tenant scope, and the hours count them by action."""
    chatbot = make_use_case(make_tenant("acme"), "chatbot")
    add_finding(valkey_client, use_case_id=chatbot.pk, request_id="r1")
    add_finding(valkey_client, use_case_id=chatbot.pk, request_id="r2", at_ms=ms(AT_1402, 60))
    add_finding(
        valkey_client,
        use_case_id=chatbot.pk,
        request_id="r3",
        guardrail="prompt_injection",
        action="blocked",
        entities='{"injection": 1}',
        score=0.99,
    )
    add_finding(
        valkey_client,
        use_case_id=chatbot.pk,
        request_id="r4",
        at_ms=ms(AT_1402, 3600),
        stage="response",
        guardrail="toxicity",
        action="failed_open",
        entities="{}",
        score="",
    )

    report = usage_persist(client=valkey_client, consumer="t")

    assert report.findings == 4
    assert hours() == {
        (chatbot.pk, "pii", "redacted", HOUR_14): 2,
        (chatbot.pk, "prompt_injection", "blocked", HOUR_14): 1,
        (chatbot.pk, "toxicity", "failed_open", HOUR_15): 1,
    }
    first = GuardrailFinding.objects.get(request_id="r1")
    assert first.entities == {"EMAIL_ADDRESS": 2, "PERSON": 1}
    assert (first.stage, first.model, first.key_id, first.policy_version) == (
        "request",
        "llama-test",
        11,
        4,
    )
    assert first.tenant_id == chatbot.tenant_id
    assert first.score == pytest.approx(0.85)
    assert GuardrailFinding.objects.get(request_id="r4").score is None
    assert GuardrailHour.objects.filter(use_case_id=chatbot.pk).first().tenant_id == (
        chatbot.tenant_id
    )


def test_findings_delivered_again_are_not_counted_twice(valkey_client: valkey.Valkey) -> None:
    add_finding(valkey_client, request_id="r1")
    usage_persist(client=valkey_client, consumer="t")
    # The state a worker killed between COMMIT and XACK leaves: the entry delivered again.
    valkey_client.xgroup_setid(GUARDRAILS_STREAM, GROUP, id="0")
    valkey_client.xreadgroup(GROUP, "killed-worker", {GUARDRAILS_STREAM: ">"})

    report = usage_persist(client=valkey_client, consumer="t")

    assert report.findings == 0
    assert report.replayed == 1
    assert GuardrailFinding.objects.count() == 1
    assert hours() == {(7, "pii", "redacted", HOUR_14): 1}


@pytest.mark.parametrize(
    "spoil",
    [
        {"action": "ignored"},
        {"stage": "sideways"},
        {"guardrail": ""},
        {"entities": "[1, 2]"},
        {"entities": '{"PERSON": -1}'},
        {"entities": "not json"},
        {"at_ms": "soon"},
    ],
)
def test_a_malformed_finding_is_skipped_and_the_rest_persist(
    valkey_client: valkey.Valkey, spoil
) -> None:
    add_finding(valkey_client, request_id="bad", **spoil)
    add_finding(valkey_client, request_id="good")

    report = usage_persist(client=valkey_client, consumer="t")

    assert report.malformed == 1
    assert list(GuardrailFinding.objects.values_list("request_id", flat=True)) == ["good"]
    assert pending(valkey_client) == 0


@pytest.mark.django_db(transaction=True)  # the worker's connection sees committed rows only
def test_the_celery_task_persists_findings_through_a_real_worker(
    valkey_client: valkey.Valkey,
    valkey_url: str,
    celery_worker: ManagedProcess,
) -> None:
    from config.celery import app
    from records.tasks import persist_usage

    add_finding(valkey_client, request_id="via-celery")
    app.conf.update(broker_url=for_kombu(valkey_url), result_backend=for_kombu(valkey_url))
    persist_usage.delay()

    assert wait_until(lambda: GuardrailFinding.objects.exists(), timeout=30), (
        celery_worker.log_tail()
    )
    assert GuardrailFinding.objects.get().request_id == "via-celery"
    assert wait_until(lambda: GuardrailHour.objects.exists(), timeout=5)
    assert hours() == {(7, "pii", "redacted", HOUR_14): 1}
    assert wait_until(lambda: "succeeded" in celery_worker.log_text(), timeout=10)
    assert pending(valkey_client) == 0
