"""The few raw-ASGI primitives the simulator needs: bodies in, responses and streams out.

Headers are the ones vLLM's responses carry, in their order: uvicorn's ``date`` and
``server``, then ``allow`` (405 only), ``content-length``, ``content-type``, and the
``vary: Origin`` of vLLM's CORS middleware; streams have no length and are chunked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

# The raw-ASGI primitives are the gateway's; only the response shapes below are vLLM's own.
from runtime.http import (
    BodyTooLarge,
    ClientGone,
    Message,
    Receive,
    Scope,
    Send,
    header,
    read_body,
)

__all__ = [
    "BodyTooLarge",
    "ClientGone",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "header",
    "read_body",
]

Headers = list[tuple[bytes, bytes]]

JSON = b"application/json"
SSE = b"text/event-stream; charset=utf-8"
VARY = (b"vary", b"Origin")


async def send_response(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes | None = JSON,
    leading_headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    headers: Headers = [*leading_headers, (b"content-length", b"%d" % len(body))]
    if content_type is not None:
        headers.append((b"content-type", content_type))
    headers.append(VARY)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def start_stream(send: Send, content_type: bytes = SSE) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", content_type), VARY],
        }
    )


async def send_chunk(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def end_stream(send: Send) -> None:
    await send({"type": "http.response.body", "body": b""})


class DisconnectWatch:
    """Notices the client going away while we are still answering.

    Only valid once the body has been read: from then on the only message ASGI delivers is
    ``http.disconnect``. Callbacks run as soon as it arrives.
    """

    __slots__ = ("_callbacks", "_task", "gone")

    def __init__(self, receive: Receive) -> None:
        self.gone = False
        self._callbacks: list[Callable[[], None]] = []
        self._task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        for callback in self._callbacks:
            callback()

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    async def wait(self, seconds: float | None = None) -> bool:
        """Wait for the client to leave, at most ``seconds`` if given; True if it left."""
        if not self.gone:
            await asyncio.wait((self._task,), timeout=seconds)
        return self.gone

    def cancel(self) -> None:
        self._task.cancel()
