"""Refusals reach the hash-chained audit trail as per-minute summaries, exactly once.

Entries are written to a real Valkey with the gateway's field schema and persisted by the
real service into the real database; the chain is checked with ``audit_verify``.
"""

from __future__ import annotations

from typing import Any

import pytest
import valkey

from gateway.accounting import DECISIONS_STREAM
from governance.audit import audit_verify
from governance.models import AuditEvent
from records.models import AdmissionDecision, StreamCursor
from records.usage import GROUP, REFUSAL_ACTION, usage_persist
from tests.records.test_usage import AT_1402, MINUTE_1402, add_decision, ms, pending

pytestmark = pytest.mark.django_db

TPM = "rate_limit:tenant acme tokens per minute"


def detail(event: AuditEvent) -> dict[str, Any]:
    assert isinstance(event.after, dict)
    return event.after


def summaries() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=REFUSAL_ACTION).order_by("sequence"))


def summary_for(decision: str, reason: str) -> AuditEvent:
    return AuditEvent.objects.get(
        action=REFUSAL_ACTION, after__decision=decision, after__reason=reason
    )


def redeliver_to_a_dead_worker(client: valkey.Valkey) -> None:
    """The state a worker killed between COMMIT and XACK leaves behind."""
    client.xgroup_setid(DECISIONS_STREAM, GROUP, "0")
    client.xreadgroup(GROUP, "killed-worker", {DECISIONS_STREAM: ">"})


def test_a_batch_of_refusals_is_summarised_per_group_in_the_audit_trail(
    valkey_client: valkey.Valkey,
) -> None:
    # GIVEN, at 14:02, three requests over acme's token limit (two policy versions), one
    # over max_concurrent, one shed at the queue deadline, one the next minute, another use
    # case refused for the same reason, and two requests that only waited in the queue
    for n, (after, version) in enumerate(((0, 3), (10, 3), (30, 4))):
        add_decision(
            valkey_client,
            request_id=f"tpm-{n}",
            reason=TPM,
            at_ms=ms(AT_1402, after),
            policy_version=version,
        )
    add_decision(valkey_client, request_id="conc-0", reason="max_concurrent_exceeded")
    add_decision(
        valkey_client,
        request_id="shed-0",
        decision="shed",
        reason="queue_timeout",
        wait_ms=30000,
        at_ms=ms(AT_1402, 40),
    )
    add_decision(valkey_client, request_id="tpm-later", reason=TPM, at_ms=ms(AT_1402, 60))
    add_decision(valkey_client, request_id="other-uc", reason=TPM, use_case_id=8)
    for n in range(2):
        add_decision(
            valkey_client, request_id=f"wait-{n}", decision="queued", reason="", wait_ms=120
        )

    # WHEN the persister stores the batch
    report = usage_persist(client=valkey_client, consumer="w1")

    # THEN one audit event per (use case, model, decision, reason, minute) group of refusals
    assert report.decisions == 9
    assert report.refusal_summaries == 5
    events = summaries()
    assert len(events) == 5
    tpm = AuditEvent.objects.get(
        action=REFUSAL_ACTION,
        object_id="7",
        after__reason=TPM,
        after__minute=MINUTE_1402.isoformat(),
    )
    assert tpm.actor == "system:usage-persister"
    assert (tpm.object_type, tpm.tenant_slug) == ("governance.usecase", "acme")
    assert tpm.after == {
        "tenant": "acme",
        "use_case_id": 7,
        "model": "llama-test",
        "decision": "rejected",
        "reason": TPM,
        "minute": "2025-03-04T14:02:00+00:00",
        "count": 3,
        "first_at": "2025-03-04T14:02:05+00:00",
        "last_at": "2025-03-04T14:02:35+00:00",
        "policy_versions": [3, 4],
        "request_ids": ["tpm-0", "tpm-1", "tpm-2"],
        "request_ids_omitted": 0,
        "first_stream_id": AdmissionDecision.objects.get(request_id="tpm-0").stream_id,
        "last_stream_id": AdmissionDecision.objects.get(request_id="tpm-2").stream_id,
    }
    assert "3 rejected" in tpm.object_repr
    shed = summary_for("shed", "queue_timeout")
    assert (detail(shed)["count"], detail(shed)["request_ids"]) == (1, ["shed-0"])
    assert detail(summary_for("rejected", "max_concurrent_exceeded"))["request_ids"] == ["conc-0"]
    later = AuditEvent.objects.get(action=REFUSAL_ACTION, after__request_ids=["tpm-later"])
    assert detail(later)["minute"] == "2025-03-04T14:03:00+00:00"
    assert detail(AuditEvent.objects.get(action=REFUSAL_ACTION, object_id="8"))["count"] == 1

    # AND every refusal row names its summary; the queue waits have none
    for row in AdmissionDecision.objects.filter(decision__in=("rejected", "shed")):
        assert row.audit_sequence is not None
        event = AuditEvent.objects.get(sequence=row.audit_sequence)
        assert row.request_id in detail(event)["request_ids"]
    waits = AdmissionDecision.objects.filter(decision="queued")
    assert [w.audit_sequence for w in waits] == [None, None]
    assert not AuditEvent.objects.filter(after__decision="queued").exists()

    # AND the chain still verifies
    verified = audit_verify()
    assert verified.ok, verified.problem
    assert verified.events_checked == 5


def test_queue_waits_alone_write_no_audit_event(valkey_client: valkey.Valkey) -> None:
    for n in range(3):
        add_decision(valkey_client, request_id=f"wait-{n}", decision="queued", wait_ms=50)
    add_decision(valkey_client, request_id="slow-admit", decision="admitted", wait_ms=900)

    report = usage_persist(client=valkey_client, consumer="w1")

    assert report.decisions == 4
    assert report.refusal_summaries == 0
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_a_flood_of_refusals_is_one_event_with_the_first_request_ids(
    valkey_client: valkey.Valkey,
) -> None:
    with valkey_client.pipeline(transaction=False) as pipe:
        for n in range(500):
            fields = {
                "request_id": f"flood-{n:03}",
                "at_ms": str(ms(AT_1402, n / 100)),
                "decision": "rejected",
                "reason": "rate_limit:use_case 7 requests per minute",
                "tenant": "acme",
                "use_case_id": "7",
                "key_id": "11",
                "model": "llama-test",
                "wait_ms": "0",
                "policy_version": "3",
            }
            pipe.xadd(DECISIONS_STREAM, fields)
        pipe.execute()

    usage_persist(client=valkey_client, consumer="w1")

    (event,) = summaries()
    assert detail(event)["count"] == 500
    assert detail(event)["request_ids"] == [f"flood-{n:03}" for n in range(20)]
    assert detail(event)["request_ids_omitted"] == 480
    assert AdmissionDecision.objects.filter(audit_sequence=event.sequence).count() == 500


def test_a_redelivered_batch_writes_no_second_summary(valkey_client: valkey.Valkey) -> None:
    # GIVEN a batch of refusals persisted and summarised
    for n in range(4):
        add_decision(valkey_client, request_id=f"r{n}", reason=TPM)
    usage_persist(client=valkey_client, consumer="w1")
    before = [(e.sequence, e.hash) for e in summaries()]
    assert len(before) == 1

    # WHEN its entries come back to a worker that then died (COMMIT, then killed before XACK)
    redeliver_to_a_dead_worker(valkey_client)
    report = usage_persist(client=valkey_client, consumer="w2")

    # THEN they are acknowledged as replays and summarised no second time
    assert (report.claimed, report.replayed, report.refusal_summaries) == (4, 4, 0)
    assert pending(valkey_client, DECISIONS_STREAM) == 0

    # AND even with the cursor reset (every entry looks new again) the rows, which name
    # their summary, are not summarised twice
    StreamCursor.objects.filter(stream=DECISIONS_STREAM).update(last_id="0-0")
    redeliver_to_a_dead_worker(valkey_client)
    report = usage_persist(client=valkey_client, consumer="w3")
    assert report.claimed == 4
    assert report.refusal_summaries == 0
    assert [(e.sequence, e.hash) for e in summaries()] == before
    assert AdmissionDecision.objects.count() == 4
    assert audit_verify().ok


def test_a_run_that_dies_before_commit_leaves_no_summary_and_the_next_writes_it_once(
    valkey_client: valkey.Valkey, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_decision(valkey_client, request_id="r1", reason=TPM)
    add_decision(valkey_client, request_id="r2", decision="shed", reason="queue_full")

    # GIVEN a run that fails after writing its summaries but before its transaction commits
    original_save = StreamCursor.save

    def crash(self: StreamCursor, *args: Any, **kwargs: Any) -> None:
        if self.stream == DECISIONS_STREAM and kwargs.get("update_fields"):
            raise RuntimeError("worker killed")  # as it advances the cursor
        original_save(self, *args, **kwargs)

    monkeypatch.setattr(StreamCursor, "save", crash)
    with pytest.raises(RuntimeError):
        usage_persist(client=valkey_client, consumer="dying")
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))
    assert not AdmissionDecision.objects.exists()
    assert pending(valkey_client, DECISIONS_STREAM) == 2
    monkeypatch.setattr(StreamCursor, "save", original_save)

    # WHEN the next run comes
    report = usage_persist(client=valkey_client, consumer="w2")

    # THEN it claims the orphans and summarises them once, on an unbroken chain
    assert (report.claimed, report.refusal_summaries) == (2, 2)
    assert [e.sequence for e in summaries()] == [1, 2]
    assert audit_verify().ok


def test_a_minute_spread_over_several_batches_sums_up_across_its_summaries(
    valkey_client: valkey.Valkey,
) -> None:
    for n in range(25):
        add_decision(valkey_client, request_id=f"r{n}", reason=TPM, at_ms=ms(AT_1402, n))

    usage_persist(client=valkey_client, consumer="w1", batch_size=10)

    events = summaries()
    assert [detail(e)["count"] for e in events] == [10, 10, 5]
    assert {detail(e)["minute"] for e in events} == {MINUTE_1402.isoformat()}
    assert AdmissionDecision.objects.filter(audit_sequence__isnull=True).count() == 0
    assert audit_verify().ok
