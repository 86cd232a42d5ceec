"""The request id on every log line the gateway writes while serving that request.

``handle_http`` sets ``REQUEST_ID`` once per request; the context is copied into every task
the request starts, so the scheduler's, the upstream client's and the accounting's log lines
carry it too, without passing it around. Lines written outside a request say ``-``.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

REQUEST_ID: ContextVar[str] = ContextVar("switchyard_request_id", default="-")

LOG_FORMAT = (
    "ts=%(asctime)s level=%(levelname)s logger=%(name)s request_id=%(request_id)s %(message)s"
)


class RequestIdFilter(logging.Filter):
    """Adds ``record.request_id`` from the current context (a handler filter: it sees the
    records of every logger that propagates to the handler)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


def configure(level: str) -> None:
    """The gateway process's logging: one line per record, key=value, request id included."""
    logging.basicConfig(level=level, format=LOG_FORMAT)
    for handler in logging.getLogger().handlers:
        handler.addFilter(RequestIdFilter())
