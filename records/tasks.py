"""The records' Celery tasks: drain the gateway's streams into rows and sealed objects, and
apply retention. Their names are the ones they were queued under before records/ was split out
of scheduler/ (beat and queued messages name them), so they keep the ``scheduler.`` prefix."""

from __future__ import annotations

import logging

import valkey
from celery import shared_task

from records.interaction_retention import record_retention_apply
from records.interactions import StorageUnavailable, records_persist
from records.usage import usage_persist
from records.usage_retention import retention_apply

logger = logging.getLogger(__name__)


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
