"""The persister trims what it has committed and acknowledged, and nothing it has not read
(issue 10, item 13): the gateway no longer trims the accounting streams, so the persister
keeps them short — never past the consumer group's oldest unacknowledged entry.
"""

from __future__ import annotations

import pytest
import valkey

from gateway.accounting import DECISIONS_STREAM, GUARDRAILS_STREAM, USAGE_STREAM
from records.usage import GROUP, usage_persist
from tests.records.test_usage import add_usage as add_usage_entry

pytestmark = pytest.mark.django_db


def add_usage(client: valkey.Valkey, n: int) -> bytes:
    return add_usage_entry(
        client, request_id=f"r-{n}", at_ms=1_741_096_925_000 + n, prompt_tokens=1
    )


def test_a_run_trims_what_it_committed_and_keeps_what_it_has_not_read(
    valkey_client: valkey.Valkey,
) -> None:
    ids = [add_usage(valkey_client, n) for n in range(50)]

    report = usage_persist(
        client=valkey_client, batch_size=10, max_batches=2, keep_acknowledged_ms=0
    )

    assert report.usage == 20
    assert valkey_client.xlen(USAGE_STREAM) == 30
    assert [entry_id for entry_id, _ in valkey_client.xrange(USAGE_STREAM)] == ids[20:]
    assert report.unread == {USAGE_STREAM: 30, DECISIONS_STREAM: 0, GUARDRAILS_STREAM: 0}


def test_entries_another_consumer_read_but_never_acked_are_not_trimmed(
    valkey_client: valkey.Valkey,
) -> None:
    """GIVEN a consumer that read 5 entries and died before acknowledging them, and a second
    consumer group that has read nothing, THEN a run trims nothing the other group still
    needs, and never the pending entries it claims."""
    ids = [add_usage(valkey_client, n) for n in range(20)]
    valkey_client.xgroup_create(USAGE_STREAM, GROUP, id="0")
    valkey_client.xreadgroup(GROUP, "dead-consumer", {USAGE_STREAM: ">"}, count=5)
    valkey_client.xgroup_create(USAGE_STREAM, "an-archiver", id="0")

    usage_persist(client=valkey_client, batch_size=100, max_batches=1, keep_acknowledged_ms=0)

    assert [entry_id for entry_id, _ in valkey_client.xrange(USAGE_STREAM)] == ids

    valkey_client.xgroup_destroy(USAGE_STREAM, "an-archiver")
    add_usage(valkey_client, 20)
    usage_persist(client=valkey_client, batch_size=100, max_batches=1, keep_acknowledged_ms=0)
    assert valkey_client.xlen(USAGE_STREAM) == 0


def test_acknowledged_entries_of_the_last_hour_are_kept(valkey_client: valkey.Valkey) -> None:
    ids = [add_usage(valkey_client, n) for n in range(5)]

    report = usage_persist(client=valkey_client)

    assert report.usage == 5
    assert report.trimmed == 0
    assert [entry_id for entry_id, _ in valkey_client.xrange(USAGE_STREAM)] == ids
