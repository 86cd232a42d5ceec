"""Transcript capture for use cases whose record policy is ``full`` (issue 12).

What an auditor reads must be what the client got, so the response is captured where it
leaves the gateway: a ``Recorder`` wraps the ASGI ``send`` of a full-record request and keeps
the body bytes passed through it — after response redaction, after the usage-chunk filter of
a stream, and the gateway's own error bodies too — up to a per-side limit (past it, the
first part is kept and the transcript marked truncated). The request is the body as
forwarded to the replica, after the request guardrails' redactions, with what the gateway
itself adds (the served model name, the model's completion bound, a stream's request for its
usage chunk; not the priority); a request refused before it was forwarded (429, a guardrail's
block) is kept as it stood then, with the redactions that ran; one refused because a request
guardrail could not run (fail closed) keeps no request text, since a redaction may be what
did not run. An audio upload is kept as a description (fields, file name, type, size,
SHA-256), never the audio.

Nothing here runs for ``none`` and ``metadata`` use cases: the gateway looks the policy up
once and wraps ``send`` only for ``full``. Per response chunk the recorder does one list
append; the chunks are joined once, by the accounting packer (gateway/accounting.py), which
hands the transcript to ``sy:records``.
"""

from __future__ import annotations

import hashlib

import orjson

from gateway.accounting import Content
from runtime.http import Message, Send
from runtime.multipart import Form

# A side with nothing kept (a request withheld because a redaction could not run).
EMPTY_CONTENT = Content((), 0)


class Recorder:
    """An ASGI ``send`` that keeps what passes through it (status, content type, body bytes,
    capped at ``limit``) and passes every message on unchanged."""

    __slots__ = ("_send", "content_type", "limit", "parts", "size", "status", "truncated")

    def __init__(self, send: Send, limit: int) -> None:
        self._send = send
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.truncated = False
        self.status = 0
        self.content_type = b""

    async def __call__(self, message: Message) -> None:
        await self._send(message)
        # Kept once sent: bytes the server would not take did not reach the client.
        kind = message["type"]
        if kind == "http.response.body":
            body = message.get("body")
            if body:
                self.keep(body)
        elif kind == "http.response.start":
            self.status = message["status"]
            for name, value in message.get("headers") or ():
                if name == b"content-type":
                    self.content_type = bytes(value)

    def keep(self, body: bytes) -> None:
        room = self.limit - self.size
        if len(body) > room:
            self.truncated = True
            if room <= 0:
                return
            body = body[:room]
        self.parts.append(body)
        self.size += len(body)

    @property
    def response(self) -> Content:
        return Content(self.parts, self.size)


def capped(content: bytes, limit: int) -> tuple[Content, bool]:
    """``content`` as a transcript side, cut to ``limit`` bytes; and whether it was cut."""
    if len(content) > limit:
        return Content((content[:limit],), limit), True
    return Content((content,), len(content)), False


def upload_description(form: Form, digests: dict[str, str]) -> bytes:
    """A multipart upload as a transcript keeps it: its fields, and per file its name, type,
    size and SHA-256 (``digests``, by field name) — an auditor can match the original file,
    and a transcript never holds audio."""
    return orjson.dumps(
        {
            "multipart": True,
            "fields": form.fields,
            "files": {
                name: {
                    "filename": upload.filename,
                    "content_type": upload.content_type,
                    "size": len(upload.data),
                    "sha256": digests.get(name, ""),
                }
                for name, upload in form.files.items()
            },
        }
    )


def file_digests(form: Form) -> dict[str, str]:
    """SHA-256 of each uploaded file; CPU work (25 MiB is tens of milliseconds), so the
    gateway runs it in a thread, beside the upstream call (hashlib releases the GIL)."""
    return {name: hashlib.sha256(upload.data).hexdigest() for name, upload in form.files.items()}
