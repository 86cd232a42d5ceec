from __future__ import annotations

import socket
import time

import valkey
from celery import shared_task

from scheduler.retention import retention_apply
from scheduler.usage import usage_persist


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
