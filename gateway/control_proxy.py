"""The gateway's door to the web process for ``/v1/files…`` and ``/v1/batches…``.

Files and batches are governance records (audited, in the database), which the gateway never
touches; so that the OpenAI SDK works unchanged with one ``base_url``, the gateway forwards
these paths to the web process (``SWITCHYARD_CONTROL_URL``), which serves them
(scheduler/files/api/openai_batch.py) and does its own authentication. A streaming reverse proxy:
the request body goes up as it arrives (bounded), the answer comes back as it is read, and
both are passed through unchanged apart from the hop-by-hop headers.

Off the hot path: the gateway asks ``handles(path)`` only for paths it has no route for, and
the aiohttp session is created on the first forwarded request. The web process down or cut
short answers 502 in OpenAI's error shape; no control URL configured, 503.

Only the routes of those two APIs go through (``ROUTES``), read from the raw path as the client
sent it: a dot segment, an empty segment, a backslash or any percent-escape is refused (400)
before matching, so that what is matched is what the web process receives. The ASGI
``path`` is already percent-decoded, and aiohttp resolves dot segments in the URL it is
given: ``/v1/files/..%2F..%2Fadmin/`` once reached the web's admin.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator

import aiohttp

from gateway import errors
from gateway.errors import GatewayError
from runtime.http import BodyTooLarge, ClientGone, Receive, Scope, Send, header

logger = logging.getLogger(__name__)

PREFIXES = ("/v1/files", "/v1/batches")
# The Files and Batch APIs' routes (scheduler/files/api/openai_batch.py), with the ids the web
# process mints ("file-…", "batch_…"): nothing else under the prefixes is forwarded.
_ID = r"[A-Za-z0-9_-]{1,128}"
ROUTES = re.compile(rf"/v1/(?:files(?:/{_ID}(?:/content)?)?|batches(?:/{_ID}(?:/cancel)?)?)")
# No route needs these, and each can make the web process (or aiohttp) read another path.
_AMBIGUOUS = re.compile(r"%|\\|//|/\.\.?(?:/|$)")
CHUNK_BYTES = 64 * 1024
# RFC 9110 §7.6.1, plus Host (the web process's own) and Expect (this hop's uvicorn already
# answered a 100-continue; the web process gets the body without asking).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"expect",
    }
)


def handles(path: str) -> bool:
    """``/v1/files``, ``/v1/batches`` and anything below them (not ``/v1/filesystem``)."""
    for prefix in PREFIXES:
        if path.startswith(prefix) and (len(path) == len(prefix) or path[len(prefix)] == "/"):
            return True
    return False


def upstream_path(scope: Scope) -> str:
    """The path to forward: the raw path when it is plain and one of ``ROUTES``, else a
    GatewayError (400 for an ambiguous spelling, 404 for any other path)."""
    raw: bytes | None = scope.get("raw_path")
    path = raw.decode("latin-1") if raw is not None else scope["path"]
    if _AMBIGUOUS.search(path):
        raise errors.bad_request(
            "The path may not contain dot segments, empty segments, backslashes or "
            "percent-escapes.",
            code="invalid_path",
        )
    if not ROUTES.fullmatch(path):
        raise errors.not_found(f"Unknown path {path}.")
    return path


class ControlProxy:
    def __init__(self, base_url: str, *, max_body_bytes: int, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_body_bytes = max_body_bytes
        self.timeout = aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=100),
                timeout=self.timeout,
                auto_decompress=False,  # relay the bytes (and Content-Encoding) as they are
                skip_auto_headers=("User-Agent", "Content-Type", "Accept-Encoding", "Accept"),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def forward(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        """Relay one request to the web process and its answer back."""
        path = upstream_path(scope)
        if not self.base_url:
            raise GatewayError(
                503,
                "Files and batches are not served here (SWITCHYARD_CONTROL_URL is not set).",
                type="service_unavailable",
                code="control_not_configured",
            )
        length = header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            raise BodyTooLarge(self.max_body_bytes)
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in scope["headers"]
            if name not in HOP_BY_HOP and name not in (b"x-request-id", b"x-forwarded-for")
        ]
        headers.append(("x-request-id", request_id.decode()))
        # This gateway is one more proxy hop: it appends its peer, as every proxy does, so the
        # web process's audit sees the client (with the hop counted in TRUSTED_PROXY_HOPS).
        client = scope.get("client")
        forwarded = header(scope, b"x-forwarded-for")
        chain = [forwarded.decode("latin-1")] if forwarded else []
        if client:
            chain.append(str(client[0]))
        if chain:
            headers.append(("x-forwarded-for", ", ".join(chain)))
        url = self.base_url + path
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        has_body = scope["method"] in ("POST", "PUT", "PATCH")
        too_large = False

        async def body() -> AsyncIterator[bytes]:
            nonlocal too_large
            size = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone
                chunk: bytes = message.get("body", b"")
                if chunk:
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        too_large = True
                        raise BodyTooLarge(self.max_body_bytes)
                    yield chunk
                if not message.get("more_body", False):
                    return

        try:
            async with self._client().request(
                scope["method"],
                url,
                headers=headers,
                data=body() if has_body else None,
                allow_redirects=False,
            ) as answer:
                response_headers = [
                    (name.lower(), value)
                    for name, value in answer.raw_headers
                    if name.lower() not in HOP_BY_HOP and name.lower() != b"x-request-id"
                ]
                response_headers.append((b"x-request-id", request_id))
                await send(
                    {
                        "type": "http.response.start",
                        "status": answer.status,
                        "headers": response_headers,
                    }
                )
                try:
                    async for chunk in answer.content.iter_chunked(CHUNK_BYTES):
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except (TimeoutError, aiohttp.ClientError) as exc:
                    # The head is out: all that can be said now is a cut connection.
                    logger.warning("control_proxy_cut path=%s error=%r", scope["path"], exc)
                    raise ClientGone from exc
                await send({"type": "http.response.body", "body": b""})
        except (BodyTooLarge, ClientGone):
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            if too_large:
                raise BodyTooLarge(self.max_body_bytes) from exc
            logger.warning("control_proxy_failed path=%s error=%r", scope["path"], exc)
            raise GatewayError(
                502,
                "The files and batches service (the web process) did not answer; try again "
                "shortly.",
                type="server_error",
                code="control_unreachable",
                headers=[(b"retry-after", b"5")],
            ) from exc
