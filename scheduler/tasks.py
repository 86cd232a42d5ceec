"""Celery tasks of scheduler/ itself; the file jobs' tasks are ``scheduler.files.tasks``
(imported here so that the worker's autodiscovery of ``scheduler.tasks`` registers them) and
the records' are ``records.tasks``."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

from celery import shared_task
from django.conf import settings

from scheduler.files import tasks as file_tasks  # noqa: F401  (registers the file tasks)
from scheduler.files.webhooks import WebhookRetry, task_webhook_deliver
from scheduler.model_notices import model_notice_deliver

logger = logging.getLogger(__name__)


@shared_task(name="scheduler.ping")
def ping(payload: str = "") -> dict[str, object]:
    """Round-trip check through the broker: which worker answered, and when."""
    return {"pong": payload, "worker": socket.gethostname(), "at": time.time()}


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
    try:
        return task_webhook_deliver(use_case_id, callback_url, event_type, message_id, data)
    except WebhookRetry as exc:
        if self.request.retries + 1 >= settings.WEBHOOK_ATTEMPTS:
            logger.warning("task_webhook_gave_up task=%s why=%s", data.get("id"), exc)
            return "gave_up"
        raise self.retry(countdown=min(3600, 2**self.request.retries), exc=exc) from exc


@shared_task(name="scheduler.deliver_model_notice", bind=True, ignore_result=True, max_retries=None)
def deliver_model_notice(self: Any, model_id: int, use_case_id: int, message_id: str) -> str:
    """POST a model's deprecation to a use case's webhook, signed; retried with backoff. Sent
    by name by governance (governance/services/model_lifecycle.py), which imports no scheduler."""
    try:
        return model_notice_deliver(model_id, use_case_id, message_id)
    except WebhookRetry as exc:
        if self.request.retries + 1 >= settings.WEBHOOK_ATTEMPTS:
            logger.warning("model_notice_gave_up model=%s use_case=%s", model_id, use_case_id)
            return "gave_up"
        raise self.retry(countdown=min(3600, 2**self.request.retries), exc=exc) from exc
