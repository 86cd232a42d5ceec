"""Persisting the gateway's accounting streams: roll-ups, the admission audit, exactly-once.

The entries are written the way the gateway writes them (the real ``Accounting`` writer, or
its field schema), into a real Valkey, and persisted by the real service and task.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from typing import Any

import pytest
import valkey
import valkey.asyncio as avalkey

from gateway.accounting import (
    DECISION_FIELDS,
    DECISIONS_STREAM,
    USAGE_FIELDS,
    USAGE_STREAM,
    Accounting,
)
from ops.processes import ManagedProcess, wait_until
from records.models import AdmissionDecision, StreamCursor, UsageMinute
from records.usage import GROUP, usage_persist
from runtime.valkey_urls import for_kombu

pytestmark = pytest.mark.django_db

AT_1402 = datetime(2025, 3, 4, 14, 2, 5, tzinfo=UTC)
MINUTE_1402 = datetime(2025, 3, 4, 14, 2, tzinfo=UTC)
MINUTE_1403 = datetime(2025, 3, 4, 14, 3, tzinfo=UTC)


def ms(at: datetime, plus_s: float = 0) -> int:
    return int(at.timestamp() * 1000 + plus_s * 1000)


def add_usage(client: valkey.Valkey, **values: object) -> bytes:
    """One usage entry as the gateway writes it; returns its stream id."""
    fields: dict[str, object] = dict.fromkeys(USAGE_FIELDS, "")
    fields.update(
        request_id="r",
        at_ms=ms(AT_1402),
        tenant="acme",
        use_case_id=7,
        key_id=11,
        model="llama-test",
        replica="http://10.0.0.5:8000",
        status=200,
        prompt_tokens=100,
        completion_tokens=10,
        queued_ms=0,
        upstream_ms=90,
        total_ms=95,
        policy_version=3,
    )
    fields.update(values)
    entry_id: Any = client.xadd(USAGE_STREAM, {k: str(v) for k, v in fields.items()})
    return entry_id


def add_decision(client: valkey.Valkey, **values: object) -> None:
    fields: dict[str, object] = dict.fromkeys(DECISION_FIELDS, "")
    fields.update(
        request_id="r",
        at_ms=ms(AT_1402),
        decision="rejected",
        reason="acme-requests-per-minute",
        tenant="acme",
        use_case_id=7,
        key_id=11,
        model="llama-test",
        wait_ms=0,
        policy_version=3,
    )
    fields.update(values)
    client.xadd(DECISIONS_STREAM, {k: str(v) for k, v in fields.items()})


def rollups() -> dict[tuple[int, str, datetime], tuple[int, ...]]:
    return {
        (row.use_case_id, row.model, row.minute): (
            row.requests,
            row.errors,
            row.prompt_tokens,
            row.completion_tokens,
            row.queued_ms,
            row.total_ms,
        )
        for row in UsageMinute.objects.all()
    }


def pending(client: valkey.Valkey, stream: str) -> int:
    summary: Any = client.xpending(stream, GROUP)
    return summary["pending"]


def test_a_batch_written_by_the_gateway_rolls_up_per_use_case_model_and_minute(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    # GIVEN what the gateway's writer puts on the stream for five requests
    requests = [
        # (use case, model, seconds after 14:02:05, status, prompt, completion, queued, total)
        (7, "llama-test", 0, 200, 100, 10, 0, 95),
        (7, "llama-test", 20, 200, 300, 30, 40, 400),
        (7, "llama-test", 50, 502, 50, 0, 0, 30),  # 14:02:55, still 14:02; an error
        (7, "llama-test", 60, 200, 10, 1, 0, 20),  # 14:03:05
        (8, "llama-test", 1, 200, 1, 1, 0, 5),  # another use case, same minute
    ]

    async def write() -> None:
        client = avalkey.Valkey.from_url(valkey_url)
        accounting = Accounting(client)
        await accounting.start()
        for n, (use_case, model, after, status, prompt, completion, queued, total) in enumerate(
            requests
        ):
            accounting.record_usage(
                request_id=f"req-{n}",
                tenant="acme",
                use_case_id=use_case,
                key_id=11,
                model=model,
                replica="http://10.0.0.5:8000",
                status=status,
                prompt_tokens=prompt,
                completion_tokens=completion,
                queued_ms=queued,
                upstream_ms=total - 5,
                total_ms=total,
                policy_version=3,
                at_ms=ms(AT_1402, after),
            )
        await accounting.close()
        await client.aclose()

    asyncio.run(write())

    # WHEN the persister runs
    report = usage_persist(client=valkey_client, consumer="w1")

    # THEN one row per use case × model × minute, with the sums
    assert report.usage == 5
    assert rollups() == {
        (7, "llama-test", MINUTE_1402): (3, 1, 450, 40, 40, 525),
        (7, "llama-test", MINUTE_1403): (1, 0, 10, 1, 0, 20),
        (8, "llama-test", MINUTE_1402): (1, 0, 1, 1, 0, 5),
    }
    assert UsageMinute.objects.filter(tenant="acme").count() == 3
    assert pending(valkey_client, USAGE_STREAM) == 0

    # AND a later batch for the same minute adds to its row
    add_usage(valkey_client, at_ms=ms(AT_1402, 30), prompt_tokens=5, completion_tokens=5)
    usage_persist(client=valkey_client, consumer="w1")
    assert rollups()[(7, "llama-test", MINUTE_1402)] == (4, 1, 455, 45, 40, 620)


def test_entries_delivered_again_after_commit_are_not_counted_twice(
    valkey_client: valkey.Valkey,
) -> None:
    # GIVEN a batch that was persisted …
    for n in range(3):
        add_usage(valkey_client, request_id=f"r{n}")
    add_decision(valkey_client, request_id="refused")
    usage_persist(client=valkey_client, consumer="w1")
    before = rollups()
    assert before[(7, "llama-test", MINUTE_1402)][0] == 3

    # … WHEN its entries are delivered again and left pending under a worker that then died:
    # the state a worker killed between COMMIT and XACK leaves behind
    for stream in (USAGE_STREAM, DECISIONS_STREAM):
        valkey_client.xgroup_setid(stream, GROUP, "0")
        valkey_client.xreadgroup(GROUP, "killed-worker", {stream: ">"})
    assert pending(valkey_client, USAGE_STREAM) == 3

    report = usage_persist(client=valkey_client, consumer="w2")

    # THEN they are recognised, acknowledged, and not counted again
    assert report.claimed == 4
    assert report.replayed == 4
    assert report.usage == 0
    assert rollups() == before
    assert AdmissionDecision.objects.count() == 1
    assert pending(valkey_client, USAGE_STREAM) == 0
    assert pending(valkey_client, DECISIONS_STREAM) == 0


def test_a_consumer_that_read_but_died_without_ack_has_its_entries_claimed(
    valkey_client: valkey.Valkey,
) -> None:
    # GIVEN a worker that read a batch and died before committing anything
    for n in range(5):
        add_usage(valkey_client, request_id=f"r{n}")
    usage_persist(client=valkey_client, consumer="w0")  # creates the group; nothing to do yet
    assert rollups()[(7, "llama-test", MINUTE_1402)][0] == 5
    for n in range(5, 9):
        add_usage(valkey_client, request_id=f"r{n}")
    valkey_client.xreadgroup(GROUP, "dead-worker", {USAGE_STREAM: ">"}, count=3)
    assert pending(valkey_client, USAGE_STREAM) == 3
    add_usage(valkey_client, request_id="r-after")  # and more arrives after it died

    # WHEN the next run comes
    report = usage_persist(client=valkey_client, consumer="w1")

    # THEN it takes over the dead worker's entries, then reads the new ones; each counted once
    assert report.claimed == 3
    assert report.usage == 5
    assert rollups()[(7, "llama-test", MINUTE_1402)][0] == 10
    assert pending(valkey_client, USAGE_STREAM) == 0
    consumers = {
        c["name"]: c["pending"] for c in valkey_client.xinfo_consumers(USAGE_STREAM, GROUP)
    }
    assert consumers[b"dead-worker"] == 0


def test_refusals_and_queue_waits_are_stored_for_the_auditor(
    valkey_client: valkey.Valkey,
) -> None:
    add_decision(valkey_client, request_id="req-limit", at_ms=ms(AT_1402), retry_after_s=23)
    add_decision(
        valkey_client,
        request_id="req-wait",
        decision="queued",
        reason="no_capacity",
        wait_ms=812,
        at_ms=ms(AT_1402, 1),
    )
    add_decision(valkey_client, request_id="req-shed", decision="shed", reason="queue_timeout")
    add_decision(valkey_client, request_id="req-jwt", key_id="", policy_version="")

    report = usage_persist(client=valkey_client, consumer="w1")

    assert report.decisions == 4
    # "Why was this request refused at 14:02?"
    refused = AdmissionDecision.objects.get(
        occurred_at__gte=MINUTE_1402,
        occurred_at__lt=MINUTE_1403,
        decision="rejected",
        request_id="req-limit",
    )
    assert refused.reason == "acme-requests-per-minute"
    assert (refused.tenant, refused.use_case_id, refused.key_id) == ("acme", 7, 11)
    assert (refused.model, refused.policy_version) == ("llama-test", 3)
    assert refused.occurred_at == AT_1402
    assert refused.retry_after_s == 23  # what the client was told
    waited = AdmissionDecision.objects.get(request_id="req-wait")
    assert (waited.decision, waited.reason, waited.queued_ms) == ("queued", "no_capacity", 812)
    assert waited.retry_after_s == 0  # "" in the entry: none said
    assert AdmissionDecision.objects.get(request_id="req-shed").decision == "shed"
    anonymous = AdmissionDecision.objects.get(request_id="req-jwt")
    assert (anonymous.key_id, anonymous.policy_version) == (None, None)


def test_malformed_entries_are_skipped_and_do_not_wedge_the_stream(
    valkey_client: valkey.Valkey,
) -> None:
    add_usage(valkey_client, request_id="good-1")
    valkey_client.xadd(USAGE_STREAM, {"request_id": "no-other-fields"})
    add_usage(valkey_client, request_id="bad-number", prompt_tokens="lots")
    add_decision(valkey_client, decision="maybe")
    add_usage(valkey_client, request_id="long-model", model="m" * 300)  # cut to the column

    report = usage_persist(client=valkey_client, consumer="w1")

    assert report.malformed == 3
    assert report.usage == 2
    assert rollups()[(7, "llama-test", MINUTE_1402)][0] == 1
    assert rollups()[(7, "m" * 200, MINUTE_1402)][0] == 1
    assert pending(valkey_client, USAGE_STREAM) == 0
    assert pending(valkey_client, DECISIONS_STREAM) == 0


def test_a_backlog_larger_than_a_batch_is_drained_in_batches(
    valkey_client: valkey.Valkey,
) -> None:
    for n in range(25):
        add_usage(valkey_client, request_id=f"r{n}", at_ms=ms(AT_1402, n * 10))
    report = usage_persist(client=valkey_client, consumer="w1", batch_size=10)
    assert report.usage == 25
    assert sum(row.requests for row in UsageMinute.objects.all()) == 25
    newest: Any = valkey_client.xrevrange(USAGE_STREAM, count=1)
    last = newest[0][0].decode()
    assert StreamCursor.objects.get(stream=USAGE_STREAM).last_id == last


@pytest.mark.django_db(transaction=True)  # the worker's connection sees committed rows only
def test_the_celery_task_persists_through_a_real_worker(
    valkey_client: valkey.Valkey, valkey_url: str, celery_worker: ManagedProcess
) -> None:
    from config.celery import app
    from records.tasks import persist_usage

    add_usage(valkey_client)
    add_decision(valkey_client)
    # Through the Valkey broker, as beat sends it. The app's broker and result backend are
    # bound once per session (its backend is cached on first use): to the session's Valkey,
    # as tests/scheduler/test_celery_roundtrip.py binds them too.
    app.conf.update(broker_url=for_kombu(valkey_url), result_backend=for_kombu(valkey_url))
    persist_usage.delay()

    assert wait_until(lambda: UsageMinute.objects.exists(), timeout=30), celery_worker.log_tail()
    assert UsageMinute.objects.get().requests == 1
    assert wait_until(lambda: AdmissionDecision.objects.exists(), timeout=5)
    assert AdmissionDecision.objects.get().reason == "acme-requests-per-minute"
    assert wait_until(lambda: "succeeded" in celery_worker.log_text(), timeout=10)
    assert "scheduler.persist_usage" in celery_worker.log_text()
    assert pending(valkey_client, USAGE_STREAM) == 0
    beat = app.conf.beat_schedule["persist-usage"]
    assert beat["task"] == "scheduler.persist_usage"


@pytest.mark.django_db(transaction=True)
def test_persisters_running_at_once_count_every_entry_exactly_once(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    from django.db import connection

    total = 1_000
    with valkey_client.pipeline(transaction=False) as pipe:
        for n in range(total):
            fields = dict.fromkeys(USAGE_FIELDS, "0")
            fields.update(request_id=f"r{n}", at_ms=str(ms(AT_1402, n % 120)), tenant="acme")
            fields.update(model="llama-test", use_case_id="7", status="200")
            pipe.xadd(USAGE_STREAM, fields)
        pipe.execute()

    def worker(name: str) -> None:
        client = valkey.Valkey.from_url(valkey_url)
        try:
            usage_persist(client=client, consumer=name, batch_size=25, max_batches=100)
        finally:
            client.close()
            connection.close()

    threads = [threading.Thread(target=worker, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    usage_persist(client=valkey_client, consumer="sweeper")  # whatever a skipped run left

    assert sum(row.requests for row in UsageMinute.objects.all()) == total
    assert pending(valkey_client, USAGE_STREAM) == 0
