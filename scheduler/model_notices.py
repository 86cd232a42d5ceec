"""A model's deprecation, told to the webhook of each use case approved for it.

Governance (governance/services/model_lifecycle.py) sends ``scheduler.deliver_model_notice``
by name once a deprecation commits, one task per use case with a webhook; this is the
delivery, through the same signed path as a file's end (scheduler/files/webhooks.py: Standard
Webhooks signature with the use case's secret, the URL's host checked again on every send,
no redirects). The body:

    {"type": "model.deprecated", "timestamp": 1790000000,
     "data": {"model": "llama-3.1-8b", "deprecated_at": "...", "sunset_at": "...",
              "successor": "llama-3.3-8b", "notice_url": "https://...", "at_sunset": "refuse",
              "use_case": "acme/chatbot"}}

``webhook-id`` is the same on every retry of one deprecation, so a receiver can drop
duplicates; a model deprecated again later is a new event.
"""

from __future__ import annotations

import logging
import time

import orjson

from governance.choices import ModelStatus
from governance.models import Model, UseCase
from governance.webhook_urls import WebhookRefused
from scheduler.files.webhooks import post_signed

logger = logging.getLogger(__name__)

EVENT_TYPE = "model.deprecated"


def model_notice_body(model: Model, use_case: UseCase, timestamp: int) -> bytes:
    data = {
        "model": model.public_id,
        "deprecated_at": model.deprecated_at.isoformat() if model.deprecated_at else None,
        "sunset_at": model.sunset_at.isoformat() if model.sunset_at else None,
        "successor": model.successor.public_id if model.successor else None,
        "notice_url": model.notice_url,
        "at_sunset": model.at_sunset,
        "use_case": str(use_case),
    }
    return orjson.dumps({"type": EVENT_TYPE, "timestamp": timestamp, "data": data})


def model_notice_deliver(model_id: int, use_case_id: int, message_id: str) -> str:
    """One delivery attempt; raises WebhookRetry when it should be tried again. Nothing is
    sent for a model no longer deprecated, or a use case without a webhook by now."""
    model = Model.objects.select_related("successor").filter(pk=model_id).first()
    use_case = UseCase.objects.select_related("tenant").filter(pk=use_case_id).first()
    if model is None or use_case is None:
        return "gone"
    if model.status != ModelStatus.DEPRECATED:
        return "not_deprecated"
    if not use_case.webhook_url or not use_case.webhook_secret_sealed:
        return "no_webhook"
    timestamp = int(time.time())
    body = model_notice_body(model, use_case, timestamp)
    try:
        post_signed(
            use_case.webhook_url, use_case.webhook_secret_sealed, message_id, timestamp, body
        )
    except WebhookRefused as exc:
        logger.warning(
            "model_notice_refused model=%s use_case=%s why=%s", model_id, use_case_id, exc
        )
        return "refused"
    logger.info("model_notice_delivered model=%s use_case=%s", model_id, use_case_id)
    return "delivered"
