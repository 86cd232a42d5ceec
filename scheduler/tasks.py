from __future__ import annotations

import socket
import time

from celery import shared_task


@shared_task(name="scheduler.ping")
def ping(payload: str = "") -> dict[str, object]:
    """Round-trip check through the broker: which worker answered, and when."""
    return {"pong": payload, "worker": socket.gethostname(), "at": time.time()}
