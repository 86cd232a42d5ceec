"""Tiny raw-ASGI helpers shared by the gateway and the simulator: types, a bounded body
reader, a header lookup, and the gateway's complete response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON = b"application/json"


class ClientGone(Exception):
    """The client disconnected before we finished reading its request."""


class BodyTooLarge(Exception):
    """The request body passed the reader's limit; each app answers it in its own words."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body; raises ClientGone, or BodyTooLarge past ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk: bytes = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(limit)
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


def with_member(body: bytes, member: bytes) -> bytes:
    """The JSON object ``body`` with ``member`` (``b'"key":value'``) added as its last member.

    Spliced in before the closing brace rather than re-serialised: a RAG prompt's body can be
    hundreds of kilobytes, and the gateway does this on every forward. The caller knows that
    ``body`` is a JSON object without that key, so the result is valid JSON with no duplicate
    key."""
    end = body.rfind(b"}")
    return b"%s,%s}" % (body[:end], member)


def header(scope: Scope, name: bytes) -> bytes | None:
    """One request header (lower-case name), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None
