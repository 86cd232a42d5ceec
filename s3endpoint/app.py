"""The S3 endpoint as a plain ASGI application: parse, authenticate, route, answer.

Path-style addressing only (``/<bucket>/<key>``): bucket names here are per use case, not DNS
names. Every request but a CORS preflight and ``/healthz`` is SigV4-signed; errors are S3's
XML (s3endpoint/errors.py), mapped in ``__call__`` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import valkey.asyncio as avalkey

from runtime.valkey_urls import async_client
from s3endpoint import sigv4
from s3endpoint.errors import S3Error, error_xml
from s3endpoint.markers import Markers
from s3endpoint.operations import Operations, Response
from s3endpoint.payload import STREAMING_MODES, UNSIGNED, BodyCheck, ClientGone, payload_mode
from s3endpoint.principals import Principal, PrincipalCache, UsageRecorder
from s3endpoint.registrations import check_bucket
from s3endpoint.upstream import Upstream, UpstreamSettings

logger = logging.getLogger("s3endpoint")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

USAGE_FLUSH_SECONDS = 30.0


@dataclass(frozen=True)
class EndpointConfig:
    upstream: UpstreamSettings
    valkey_url: str
    credential_ttl: float
    cors_origins: tuple[str, ...]


class S3Endpoint:
    def __init__(self, config: EndpointConfig) -> None:
        self.config = config
        self.principals = PrincipalCache(config.credential_ttl)
        self.usage = UsageRecorder()
        self._upstream: Upstream | None = None
        self._operations: Operations | None = None
        self._valkey: avalkey.Valkey | None = None
        self._flusher: asyncio.Task[None] | None = None

    # --- lifespan -----------------------------------------------------------------------
    async def startup(self) -> None:
        self._upstream = Upstream(self.config.upstream)
        self._valkey = async_client(self.config.valkey_url)
        self._operations = Operations(
            self._upstream, Markers(self._valkey), self.config.upstream.region
        )
        self._flusher = asyncio.create_task(self._flush_usage())

    async def shutdown(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        with contextlib.suppress(Exception):
            await self.usage.flush()
        if self._upstream is not None:
            await self._upstream.close()
        if self._valkey is not None:
            await self._valkey.aclose()

    async def _flush_usage(self) -> None:
        while True:
            await asyncio.sleep(USAGE_FLUSH_SECONDS)
            try:
                await self.usage.flush()
            except Exception:  # the next flush tries again; uploads go on meanwhile
                logger.exception("s3_usage_flush_failed")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # --- requests -----------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        request_id = uuid.uuid4().hex[:16].upper()
        incoming = _incoming(scope)
        cors = self._cors_headers(incoming)
        body = _TrackedBody(receive)
        try:
            response = await self._handle(incoming, body.receive)
        except ClientGone:
            return
        except S3Error as error:
            logger.info(
                "s3_refused request_id=%s method=%s path=%s code=%s",
                request_id,
                incoming.method,
                incoming.path,
                error.code,
            )
            xml = (
                b""
                if incoming.method == "HEAD"
                else error_xml(error, resource=unquote(incoming.path), request_id=request_id)
            )
            response = Response(error.status, [("content-type", "application/xml")], xml)
        except Exception:
            logger.exception("s3_failed request_id=%s", request_id)
            internal = S3Error("InternalError", "We encountered an internal error. Try again.")
            xml = error_xml(internal, resource=unquote(incoming.path), request_id=request_id)
            response = Response(500, [("content-type", "application/xml")], xml)
        headers = [
            *response.headers,
            *cors,
            ("x-amz-request-id", request_id),
        ]
        if not await body.drain():
            # A refusal before the body was read: the rest of a large body would be taken for
            # the next request on this connection, so end the connection instead.
            headers.append(("connection", "close"))
        if not any(name == "content-length" for name, _ in response.headers):
            headers.append(("content-length", str(len(response.body))))
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [(k.encode(), v.encode()) for k, v in headers],
            }
        )
        await send({"type": "http.response.body", "body": response.body})

    def _cors_headers(self, incoming: sigv4.Incoming) -> list[tuple[str, str]]:
        origin = incoming.header("origin")
        if origin is None or origin not in self.config.cors_origins:
            return []
        return [
            ("access-control-allow-origin", origin),
            ("access-control-expose-headers", "ETag, x-amz-request-id"),
            ("vary", "Origin"),
        ]

    def _preflight(self, incoming: sigv4.Incoming) -> Response:
        origin = incoming.header("origin")
        if origin is None or origin not in self.config.cors_origins:
            raise S3Error("AccessDenied", "CORSResponse: this origin is not allowed.")
        requested = incoming.header("access-control-request-headers") or ""
        return Response(
            200,
            [
                ("access-control-allow-methods", "PUT, POST, GET, HEAD, DELETE"),
                ("access-control-allow-headers", requested),
                ("access-control-max-age", "600"),
            ],
        )

    async def _handle(self, incoming: sigv4.Incoming, receive: Receive) -> Response:
        if incoming.method == "OPTIONS":
            return self._preflight(incoming)
        if incoming.path == "/healthz" and incoming.method == "GET":
            return Response(200, [("content-type", "text/plain")], b"ok\n")
        auth = sigv4.parse(incoming)
        principal = await self.principals.get(auth.access_key_id)
        sigv4.check_time(auth)
        chain = sigv4.verify(incoming, auth, principal.secret)
        self.usage.saw(principal)
        bucket, key = _split(incoming.path)
        params = dict(incoming.query_params())
        method = incoming.method
        if principal.presign_only and not (
            auth.presigned and method == "PUT" and key and "uploadId" not in params
        ):
            raise S3Error("AccessDenied", "This credential only signs presigned PUT URLs.")
        operations = self._operations
        assert operations is not None, "lifespan startup did not run"
        if not bucket:
            if method == "GET":
                return operations.list_buckets(principal)
            raise S3Error("MethodNotAllowed", "Only GET (ListBuckets) is allowed here.")
        await check_bucket(principal, bucket)
        if not key:
            return await self._bucket_operation(operations, principal, method, params)
        upload_id = params.get("uploadId")
        if method == "PUT":
            check = _body_check(incoming, auth, chain)
            if upload_id is not None:
                response = await operations.upload_part(
                    principal, key, upload_id, incoming, receive, check
                )
            else:
                response = await operations.put_object(principal, key, incoming, receive, check)
            logger.info(
                "s3_stored access_key=%s key=%s bytes=%d mode=%s trailer=%s",
                principal.access_key_id,
                key,
                check.length,
                check.mode if check.mode in (UNSIGNED, *STREAMING_MODES) else "sha256",
                check.declared_trailer or "-",
            )
            return response
        if method == "POST" and "uploads" in params:
            return await operations.create_multipart(principal, key, incoming)
        if method == "POST" and upload_id is not None:
            check = _body_check(incoming, auth, chain)
            return await operations.complete_multipart(principal, key, upload_id, receive, check)
        if method == "DELETE" and upload_id is not None:
            return await operations.abort_multipart(principal, key, upload_id)
        if method == "GET" and upload_id is not None:
            return await operations.list_parts(principal, key, upload_id, incoming)
        if method == "HEAD":
            return await operations.head_object(principal, key)
        raise S3Error("NotImplemented", f"{method} on an object is not supported here.")

    async def _bucket_operation(
        self, operations: Operations, principal: Principal, method: str, params: dict[str, str]
    ) -> Response:
        if method == "HEAD":
            return operations.head_bucket()
        if method == "GET" and "location" in params:
            return operations.bucket_location()
        if method == "GET" and params.get("list-type") == "2":
            return await operations.list_objects(principal, params)
        if method == "GET" and not (params.keys() - {"prefix", "max-keys", "delimiter"}):
            raise S3Error("NotImplemented", "Use ListObjectsV2 (list-type=2).")
        raise S3Error("NotImplemented", f"This {method} on a bucket is not supported.")


class _TrackedBody:
    """The request body's receive, noting whether the whole body has been read."""

    DRAIN_LIMIT = 8 * 1024 * 1024

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.finished = False

    async def receive(self) -> dict[str, Any]:
        message = await self._receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.finished = True
        return message

    async def drain(self) -> bool:
        """Read and drop what is left, up to a limit; whether the body is now all read."""
        drained = 0
        while not self.finished and drained <= self.DRAIN_LIMIT:
            drained += len((await self.receive()).get("body", b""))
        return self.finished


def _incoming(scope: Scope) -> sigv4.Incoming:
    raw_path = scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else quote(scope["path"], safe="/~")
    path = path.partition("?")[0]
    return sigv4.Incoming(
        method=scope["method"],
        path=path,
        query=scope.get("query_string", b"").decode("latin-1"),
        headers=tuple(
            (name.decode("latin-1").lower(), value.decode("latin-1"))
            for name, value in scope["headers"]
        ),
    )


def _split(path: str) -> tuple[str, str]:
    bucket, _, key = path.lstrip("/").partition("/")
    return unquote(bucket), unquote(key)


def _length(incoming: sigv4.Incoming, name: str) -> int:
    raw = incoming.header(name)
    if raw is None or not raw.isdigit():
        raise S3Error("MissingContentLength", f"You must provide the {name} HTTP header.")
    return int(raw)


def _body_check(
    incoming: sigv4.Incoming, auth: sigv4.Authorization, chain: sigv4.ChunkChain
) -> BodyCheck:
    declared = incoming.header("x-amz-content-sha256")
    mode = payload_mode(declared if declared is not None or not auth.presigned else UNSIGNED)
    streaming = mode in STREAMING_MODES
    expected = _length(incoming, "x-amz-decoded-content-length" if streaming else "content-length")
    trailer = incoming.header("x-amz-trailer")
    if trailer is not None and mode != "STREAMING-UNSIGNED-PAYLOAD-TRAILER":
        raise S3Error("InvalidRequest", "x-amz-trailer needs STREAMING-UNSIGNED-PAYLOAD-TRAILER.")
    return BodyCheck(
        mode=mode,
        expected_length=expected,
        declared_trailer=trailer.strip().lower() if trailer else None,
        chain=chain if mode == "STREAMING-AWS4-HMAC-SHA256-PAYLOAD" else None,
    )
