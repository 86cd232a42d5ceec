"""What the gateway's usage stream says about one request, read the way accounting writes it:
in batches, a little after the answer."""

from __future__ import annotations

import valkey

from gateway.accounting import USAGE_STREAM
from ops.processes import wait_until


def usage_models(client: valkey.Valkey, record_id: str, *, timeout: float = 10) -> list[bytes]:
    """The ``model`` of each usage entry of ``record_id`` (a request's record id, or an async
    task's id), once there is one; AssertionError if none comes within ``timeout``."""

    def models() -> list[bytes]:
        return [
            fields[b"model"]
            for _, fields in client.xrange(USAGE_STREAM)
            if fields.get(b"record_id") == record_id.encode()
        ]

    assert wait_until(lambda: bool(models()), timeout=timeout), f"no usage for {record_id}"
    return models()
