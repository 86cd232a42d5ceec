"""Streamed downloads (record exports, the signed audit export) under ASGI and WSGI alike.

Under ASGI (the web process is uvicorn with config.asgi) Django's StreamingHttpResponse
consumes a *sync* iterator whole before sending a byte — a million records would sit in
memory. So under ASGI the response gets an async iterator that pulls one chunk at a time from
the sync generator on Django's thread-sensitive executor (the same thread, so the same
database connection and cursor, for the whole stream). Under WSGI the sync generator is
handed over as it is.

When the client goes away, the generator is closed, which runs its ``finally`` (where the
exports write their audit event, marked cut short).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, StreamingHttpResponse

_END = object()


def _next_chunk(chunks: Iterator[bytes]) -> object:
    return next(chunks, _END)


async def _pulled(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    pull = sync_to_async(_next_chunk, thread_sensitive=True)
    close = sync_to_async(getattr(chunks, "close", lambda: None), thread_sensitive=True)
    try:
        while True:
            chunk = await pull(chunks)
            if chunk is _END:
                return
            assert isinstance(chunk, bytes)
            yield chunk
    finally:
        await close()


def download_response(
    request: HttpRequest, chunks: Iterator[bytes], *, filename: str, content_type: str
) -> StreamingHttpResponse:
    """A streamed attachment: never cached, never sniffed."""
    content = _pulled(chunks) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(content, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "no-store"
    response["X-Content-Type-Options"] = "nosniff"
    return response
