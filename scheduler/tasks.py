from __future__ import annotations

import logging
import socket
import time
from typing import Any

import valkey
from celery import shared_task
from django.conf import settings

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


# --- File jobs (scheduler/uploads.py, file_dispatch.py, file_jobs.py, webhooks.py) ----------


@shared_task(name="scheduler.consume_uploads", ignore_result=True)
def consume_uploads() -> dict[str, object]:
    """Match upload events to their registrations and queue their jobs."""
    from scheduler.uploads import uploads_consume

    return uploads_consume().as_dict()


@shared_task(name="scheduler.dispatch_file_jobs", ignore_result=True)
def dispatch_file_jobs() -> list[int]:
    """Hand the file jobs that may run now to workers, earliest deadline first."""
    from scheduler.file_dispatch import file_jobs_dispatch

    return file_jobs_dispatch()


@shared_task(name="scheduler.expire_multipart_uploads", ignore_result=True)
def expire_multipart_uploads() -> dict[str, int]:
    """Abort multipart uploads left unfinished past their age and free their registrations."""
    from scheduler.upload_expiry import multipart_uploads_expire

    return multipart_uploads_expire().as_dict()


@shared_task(name="scheduler.run_file_job", ignore_result=True, acks_late=True)
def run_file_job(registration_id: int, token: str) -> str:
    """Run or resume one file job under its lease (acks late: a lost worker's message is
    delivered again, and the lease says whether it still has work to do)."""
    from scheduler.file_jobs import file_job_run

    return file_job_run(registration_id, token)


@shared_task(name="scheduler.deliver_webhook", bind=True, ignore_result=True, max_retries=None)
def deliver_webhook(self: Any, registration_id: int, event_type: str, message_id: str) -> str:
    """POST a file's end to its use case's webhook, signed; retried with backoff."""
    from scheduler.webhooks import WebhookRetry, webhook_deliver

    try:
        return webhook_deliver(registration_id, event_type, message_id)
    except WebhookRetry as exc:
        if self.request.retries + 1 >= settings.WEBHOOK_ATTEMPTS:
            logger.warning("webhook_gave_up registration=%s why=%s", registration_id, exc)
            return "gave_up"
        raise self.retry(countdown=min(3600, 2**self.request.retries), exc=exc) from exc


@shared_task(name="scheduler.deliver_task_webhook", bind=True, ignore_result=True, max_retries=None)
def deliver_task_webhook(
    self: Any,
    use_case_id: int,
    callback_url: str,
    event_type: str,
    message_id: str,
    data: dict[str, Any],
) -> str:
    """POST an async task's end to its callback URL, signed; retried with backoff. Enqueued
    by the batcher (scheduler/batcher), which sends it by name without importing Django."""
    from scheduler.webhooks import WebhookRetry, task_webhook_deliver

    try:
        return task_webhook_deliver(use_case_id, callback_url, event_type, message_id, data)
    except WebhookRetry as exc:
        if self.request.retries + 1 >= settings.WEBHOOK_ATTEMPTS:
            logger.warning("task_webhook_gave_up task=%s why=%s", data.get("id"), exc)
            return "gave_up"
        raise self.retry(countdown=min(3600, 2**self.request.retries), exc=exc) from exc
