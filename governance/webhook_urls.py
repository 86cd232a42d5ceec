"""The rule for a use case's webhook URL (``UseCase.webhook_url``): never an address inside
the company's networks unless allowed (runtime/outbound_urls.py). The webhook API, the admin's
form and the sender (scheduler/files/webhooks.py, which checks again at each send) share it."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError

from runtime import outbound_urls


class WebhookRefused(ValueError):
    """A URL that is never called: not http(s), or an internal address (outbound_urls)."""


def check_url(url: str) -> str:
    """A webhook URL as it is set: refused (WebhookRefused) when it may never be called; a
    host that does not resolve yet is taken, and checked again at each send."""
    try:
        outbound_urls.check_at_registration(url, settings.WEBHOOK_ALLOWED_NETWORKS)
    except outbound_urls.OutboundRefused as exc:
        raise WebhookRefused(f"A webhook URL {exc}.") from exc
    return url


def validate_webhook_url(url: str) -> None:
    """A form validator (the admin's): the rule ``check_url`` applies, as a ValidationError."""
    if url:
        try:
            check_url(url)
        except WebhookRefused as exc:
            raise ValidationError(str(exc)) from exc
