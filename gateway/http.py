"""Tiny ASGI helpers for the gateway: read a bounded body, send a complete response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gateway.errors import GatewayError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON = b"application/json"


class ClientGone(Exception):
    """The client disconnected before we finished reading its request."""


async def read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise GatewayError(
                    413, f"Request body is larger than {limit} bytes.", code="request_too_large"
                )
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_response(
    send: Send,
    status: int,
    body: bytes,
    *,
    content_type: bytes = JSON,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    response_headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
    ]
    if headers:
        response_headers.extend(headers)
    await send({"type": "http.response.start", "status": status, "headers": response_headers})
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, name: bytes) -> bytes | None:
    """One request header (lower-case name), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return value  # type: ignore[no-any-return]
    return None
