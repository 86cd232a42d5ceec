"""A Celery worker SIGKILLed in the middle of a records batch — after it wrote objects to the
bucket, before its transaction committed — loses nothing and stores nothing twice: the
entries stay pending, the next worker claims exactly them, rewrites the same objects and
commits. Real processes throughout: Valkey, a Celery worker, SeaweedFS, the database."""

from __future__ import annotations

import base64
import os
import signal
import time
from typing import Any

import pytest
import valkey
from django.test import override_settings

from gateway.accounting import RECORDS_STREAM
from governance.models import AuditEvent
from ops.processes import wait_until
from records.interactions import STORED_ACTION, records_verify
from records.models import InteractionRecord, RecordObject
from runtime.valkey_urls import for_kombu
from testkit.records_store import RecordsStore
from tests.records.conftest import RecordsWorkerFactory
from tests.records.test_records import AT, record_fields
from tests.records.test_usage import ms, pending

HOURS = 8
PER_HOUR = 250  # one batch of 2,000 entries: eight objects of 250 transcripts
KEYS = f"crash:{base64.b64encode(os.urandom(32)).decode()}"


def fill(client: valkey.Valkey) -> set[str]:
    """2,000 transcripts of about 1 KB each way (incompressible), eight hours of one use case."""
    ids = set()
    with client.pipeline(transaction=False) as pipe:
        for hour in range(HOURS):
            for n in range(PER_HOUR):
                record_id = f"h{hour}-{n}"
                ids.add(record_id)
                noise = base64.b64encode(os.urandom(768)).decode()
                pipe.xadd(
                    RECORDS_STREAM,
                    record_fields(
                        record_id,
                        at_ms=ms(AT, hour * 3600 + n),
                        request=f'{{"q":"{noise}"}}',
                        response=f'{{"a":"{noise[::-1]}"}}',
                    ),
                )
        pipe.execute()
    return ids


def bucket_keys(store: RecordsStore) -> set[str]:
    listed: Any = store.client().list_objects_v2(Bucket=store.bucket)
    return {item["Key"] for item in listed.get("Contents", [])}


@pytest.mark.django_db(transaction=True)  # the workers' connections see committed rows only
def test_a_worker_killed_between_the_object_write_and_the_commit_loses_nothing(
    valkey_client: valkey.Valkey,
    valkey_url: str,
    records_store: RecordsStore,
    start_records_worker: RecordsWorkerFactory,
) -> None:
    from config.celery import app
    from records.tasks import persist_records

    app.conf.update(broker_url=for_kombu(valkey_url), result_backend=for_kombu(valkey_url))
    record_ids = fill(valkey_client)
    s3 = records_store.client()
    s3.create_bucket(Bucket=records_store.bucket)

    # GIVEN a worker persisting the whole backlog as one batch
    first = start_records_worker(KEYS)
    persist_records.delay(batch_size=len(record_ids))

    # WHEN it is killed once the batch's first object is in the bucket. The worker runs in
    # slices of a few milliseconds and is frozen (SIGSTOP) while the bucket is looked at, so
    # that neither the listing's own latency nor a busy machine lets it write the rest and
    # commit between the look and the kill.
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, first.log_tail()
        assert first.alive(), first.log_tail()
        first.signal(signal.SIGSTOP)
        if bucket_keys(records_store):
            break
        first.signal(signal.SIGCONT)
        time.sleep(0.003)
    first.signal(signal.SIGKILL)
    assert first.proc is not None
    first.proc.wait(10)

    # THEN it had written objects but committed nothing: the kill landed in between
    written_by_the_dead = bucket_keys(records_store)
    assert written_by_the_dead
    assert not RecordObject.objects.exists()
    assert not InteractionRecord.objects.exists()
    assert pending(valkey_client, RECORDS_STREAM) == len(record_ids)

    # WHEN another worker runs the (same-sized) batch again
    second = start_records_worker(KEYS)
    persist_records.delay(batch_size=len(record_ids))
    assert wait_until(
        lambda: InteractionRecord.objects.filter(content="stored").count() == len(record_ids),
        timeout=120,
        interval=0.5,
    ), second.log_tail()

    # THEN every record is stored exactly once, in the objects the dead worker had begun
    # (rewritten under the same names: nothing of its attempt is left beside them)
    with override_settings(RECORDS_KEYS=KEYS):
        rows = InteractionRecord.objects.all()
        assert sorted(rows.values_list("record_id", flat=True)) == sorted(record_ids)
        objects = list(RecordObject.objects.all())
        assert len(objects) == HOURS
        assert sum(obj.records for obj in objects) == len(record_ids)
        assert bucket_keys(records_store) == {obj.key for obj in objects}
        assert written_by_the_dead <= {obj.key for obj in objects}
        for obj in objects:
            verdict = records_verify(obj)
            assert verdict.ok, (obj.key, verdict.problem)
        assert AuditEvent.objects.filter(action=STORED_ACTION).count() == HOURS
    assert wait_until(lambda: pending(valkey_client, RECORDS_STREAM) == 0, timeout=10)
