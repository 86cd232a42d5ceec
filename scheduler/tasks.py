from __future__ import annotations

import logging
import socket
import time

import valkey
from celery import shared_task

from scheduler.record_retention import record_retention_apply
from scheduler.records import StorageUnavailable, records_persist
from scheduler.retention import retention_apply
from scheduler.usage import usage_persist

logger = logging.getLogger(__name__)


@shared_task(name="scheduler.ping")
def ping(payload: str = "") -> dict[str, object]:
    """Round-trip check through the broker: which worker answered, and when."""
    return {"pong": payload, "worker": socket.gethostname(), "at": time.time()}


@shared_task(
    name="scheduler.persist_usage",
    ignore_result=True,
    autoretry_for=(valkey.ConnectionError, valkey.TimeoutError),
    retry_backoff=True,
    max_retries=3,
)
def persist_usage() -> dict[str, object]:
    """Drain the gateway's usage and decision streams into the database (idempotent)."""
    return usage_persist().as_dict()


@shared_task(name="scheduler.apply_retention", ignore_result=True)
def apply_retention() -> dict[str, object]:
    """Delete usage roll-ups and admission decisions past retention, in bounded batches."""
    return retention_apply().as_dict()


@shared_task(
    name="scheduler.persist_records",
    ignore_result=True,
    autoretry_for=(valkey.ConnectionError, valkey.TimeoutError),
    retry_backoff=True,
    max_retries=3,
)
def persist_records(batch_size: int | None = None) -> dict[str, object]:
    """Drain the gateway's transcripts into sealed objects and their rows (idempotent).

    Object storage down: the batch stays pending and the next beat run (seconds later)
    takes it again, so the task does not retry itself."""
    try:
        if batch_size is None:
            return records_persist().as_dict()
        return records_persist(batch_size=batch_size).as_dict()
    except StorageUnavailable as exc:
        logger.warning("records_persist_deferred why=%s", exc)
        return {"deferred": str(exc)}


@shared_task(name="scheduler.apply_record_retention", ignore_result=True)
def apply_record_retention() -> dict[str, object]:
    """Delete interaction records and their objects past retention, unless on legal hold."""
    return record_retention_apply().as_dict()
