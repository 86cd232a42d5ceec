"""The files domain's Celery tasks: uploads matched, jobs dispatched and run, webhooks sent,
unfinished uploads and registrations expired. Names are explicit strings that queued messages
and beat carry, so they outlive any move of this module."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from scheduler.files.dispatch import file_jobs_dispatch
from scheduler.files.jobs import file_job_run
from scheduler.files.states import files_expire
from scheduler.files.upload_expiry import multipart_uploads_expire
from scheduler.files.uploads import uploads_consume
from scheduler.files.webhooks import WebhookRetry, webhook_deliver

logger = logging.getLogger(__name__)


@shared_task(name="scheduler.consume_uploads", ignore_result=True)
def consume_uploads() -> dict[str, object]:
    """Match upload events to their registrations and queue their jobs."""
    return uploads_consume().as_dict()


@shared_task(name="scheduler.dispatch_file_jobs", ignore_result=True)
def dispatch_file_jobs() -> list[int]:
    """Hand the file jobs that may run now to workers, earliest deadline first."""
    return file_jobs_dispatch()


@shared_task(name="scheduler.expire_multipart_uploads", ignore_result=True)
def expire_multipart_uploads() -> dict[str, int]:
    """Abort multipart uploads left unfinished past their age and free their registrations."""
    return multipart_uploads_expire().as_dict()


@shared_task(name="scheduler.run_file_job", ignore_result=True, acks_late=True)
def run_file_job(registration_id: int, token: str) -> str:
    """Run or resume one file job under its lease (acks late: a lost worker's message is
    delivered again, and the lease says whether it still has work to do)."""
    return file_job_run(registration_id, token)


@shared_task(name="scheduler.deliver_webhook", bind=True, ignore_result=True, max_retries=None)
def deliver_webhook(self: Any, registration_id: int, event_type: str, message_id: str) -> str:
    """POST a file's end to its use case's webhook, signed; retried with backoff."""
    try:
        return webhook_deliver(registration_id, event_type, message_id)
    except WebhookRetry as exc:
        if self.request.retries + 1 >= settings.WEBHOOK_ATTEMPTS:
            logger.warning("webhook_gave_up registration=%s why=%s", registration_id, exc)
            return "gave_up"
        raise self.retry(countdown=min(3600, 2**self.request.retries), exc=exc) from exc


@shared_task(name="governance.expire_file_registrations", ignore_result=True)
def expire_file_registrations() -> int:
    """Expire registrations never uploaded in time (on beat; bounded per run, idempotent)."""
    return files_expire(now=timezone.now())
