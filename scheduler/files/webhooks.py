"""A file's end, told to its use case's webhook, signed the Standard Webhooks way.

When a registration reaches an end (done, failed, expired, cancelled), the state machine
(scheduler/files/states.py) enqueues ``scheduler.deliver_webhook`` after its commit if the
use case has a ``webhook_url``. The task POSTs

    {"type": "file.done", "timestamp": "...", "data": {"id": 41, "state": "done", ...}}

with the headers of https://www.standardwebhooks.com: ``webhook-id`` (the same on every retry
of one event, so a receiver can drop duplicates), ``webhook-timestamp`` (epoch seconds) and
``webhook-signature: v1,<base64 HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>``, the secret
being the bytes after ``whsec_`` base64-decoded. A 2xx is delivered; anything else, or no
answer, is retried with exponential backoff (``SWITCHYARD_WEBHOOK_ATTEMPTS``). Only http(s)
URLs are ever called; redirects are not followed (a signed body must reach the URL given).
Every send resolves the URL's host again and refuses internal addresses, then connects to
the address it checked (runtime/outbound_urls.py): a URL taken when it was set may since
resolve to loopback, or the operator's allow-list may have changed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
import time
from typing import Any

import orjson
from celery import current_app
from django.conf import settings
from django.dispatch import receiver

from governance.models import FileRegistration
from governance.webhook_urls import WebhookRefused
from records.sealing import unseal
from runtime import outbound_urls
from scheduler.files.states import FileEnded, file_ended

logger = logging.getLogger(__name__)

#: scheduler/files/tasks.py's task, sent by name (tasks import this module).
DELIVER_WEBHOOK_TASK = "scheduler.deliver_webhook"

SECRET_PREFIX = "whsec_"  # noqa: S105 — the format's prefix, not a secret
EVENT_TYPES = ("file.done", "file.failed", "file.expired", "file.cancelled")


class WebhookRetry(Exception):
    """The receiver did not take the event (no answer, not 2xx): try again later."""


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value for ``body``."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def event_body(registration: FileRegistration, event_type: str, timestamp: int) -> bytes:
    data: dict[str, Any] = {
        "id": registration.pk,
        "state": registration.state,
        "kind": registration.kind,
        "filename": registration.filename,
        "model": registration.model.public_id,
        "outputs": registration.outputs,
        "counts": registration.counts,
        "failure": registration.failure,
        "progress": registration.progress,
        "promised_by": registration.promised_by.isoformat(),
        "state_changed_at": (
            registration.state_changed_at.isoformat() if registration.state_changed_at else None
        ),
    }
    return orjson.dumps({"type": event_type, "timestamp": timestamp, "data": data})


@receiver(file_ended)
def webhook_enqueue(sender: object, ended: FileEnded, **_: object) -> None:
    """A file ended (its transaction committed): queue its webhook by task name, or nothing
    without a webhook URL. A broker that cannot take it loses the webhook, not the file's end."""
    if not ended.webhook_url:
        return
    event_type = f"file.{ended.state}"
    message_id = f"msg_{ended.registration_id}_{ended.state}"  # one event per end, however retried
    try:
        current_app.send_task(
            DELIVER_WEBHOOK_TASK, args=(ended.registration_id, event_type, message_id)
        )
    except Exception:
        logger.exception("webhook_enqueue_failed registration=%s", ended.registration_id)


def webhook_deliver(registration_id: int, event_type: str, message_id: str) -> str:
    """One delivery attempt; raises WebhookRetry when it should be tried again."""
    registration = (
        FileRegistration.objects.select_related("use_case", "model")
        .filter(pk=registration_id)
        .first()
    )
    if registration is None:
        return "gone"
    use_case = registration.use_case
    if not use_case.webhook_url or not use_case.webhook_secret_sealed:
        return "no_webhook"
    timestamp = int(time.time())
    body = event_body(registration, event_type, timestamp)
    try:
        post_signed(
            use_case.webhook_url, use_case.webhook_secret_sealed, message_id, timestamp, body
        )
    except WebhookRefused as exc:
        logger.warning("webhook_refused registration=%s why=%s", registration_id, exc)
        return "refused"
    logger.info("webhook_delivered registration=%s type=%s", registration_id, event_type)
    return "delivered"


def post_signed(url: str, sealed_secret: str, message_id: str, timestamp: int, body: bytes) -> None:
    """POST ``body`` to ``url`` signed with the use case's (sealed) secret, the Standard
    Webhooks way; WebhookRefused when the URL may not be called (checked now, and the
    connection made to the address checked), WebhookRetry unless the receiver answers 2xx."""
    try:
        target = outbound_urls.resolve(url, settings.WEBHOOK_ALLOWED_NETWORKS)
    except outbound_urls.OutboundRefused as exc:
        raise WebhookRefused(f"The URL {exc}.") from exc
    except outbound_urls.HostUnresolved as exc:
        raise WebhookRetry(f"no answer: {exc}") from exc
    secret = unseal(base64.b64decode(sealed_secret)).decode()
    headers = {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, message_id, timestamp, body),
        "user-agent": "Switchyard-Webhooks/1",
    }
    try:
        status = outbound_urls.post(target, body, headers, timeout=settings.WEBHOOK_TIMEOUT_SECONDS)
    except outbound_urls.SendFailed as exc:
        raise WebhookRetry(f"no answer: {exc}") from exc
    if not 200 <= status < 300:
        raise WebhookRetry(f"answered {status}")


# --- Async tasks' callbacks (scheduler/batcher) ------------------------------------------------
TASK_EVENT_TYPES = ("task.done", "task.failed", "task.expired")


def task_event_body(event_type: str, timestamp: int, data: dict[str, Any]) -> bytes:
    return orjson.dumps({"type": event_type, "timestamp": timestamp, "data": data})


def task_webhook_deliver(
    use_case_id: int, callback_url: str, event_type: str, message_id: str, data: dict[str, Any]
) -> str:
    """One delivery of an async task's end to the ``callback_url`` it was submitted with,
    signed with its use case's webhook secret; raises WebhookRetry to be tried again.

    ``data`` is the task's poll view without the result body (the receiver polls for it)."""
    from governance.models import UseCase

    if event_type not in TASK_EVENT_TYPES:
        raise ValueError(f"not a task event: {event_type!r}")
    use_case = UseCase.objects.filter(pk=use_case_id).only("webhook_secret_sealed").first()
    if use_case is None or not use_case.webhook_secret_sealed:
        # Submit accepts a callback only from a use case with a secret: it was taken away.
        logger.warning("task_webhook_unsigned task=%s use_case=%s", data.get("id"), use_case_id)
        return "no_secret"
    timestamp = int(time.time())
    body = task_event_body(event_type, timestamp, data)
    try:
        post_signed(callback_url, use_case.webhook_secret_sealed, message_id, timestamp, body)
    except WebhookRefused as exc:
        logger.warning("task_webhook_refused task=%s why=%s", data.get("id"), exc)
        return "refused"
    logger.info("task_webhook_delivered task=%s type=%s", data.get("id"), event_type)
    return "delivered"
