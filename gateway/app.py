"""The gateway: a lean, pure-ASGI, OpenAI-compatible front door to the vLLM fleet.

Per request it does only in-memory work (authenticate against the policy snapshot, validate
the body) before forwarding over a pooled connection; the database is never touched and the
only I/O is the upstream call itself. Streams are relayed chunk by chunk and the upstream is
always closed — on completion, on error and when the client goes away.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import valkey.asyncio as avalkey

from gateway import errors
from gateway.errors import GatewayError
from gateway.http import ClientGone, Receive, Scope, Send, header, read_body, send_response
from gateway.multipart import FormError, encode_form, is_multipart, parse_form
from gateway.policy import Model, Policy, Principal
from gateway.policy_store import PolicyStore
from gateway.settings import GatewaySettings
from gateway.upstream import Upstream

logger = logging.getLogger("gateway")

_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._-]{1,128}$")

# Which capability each forwarding endpoint needs from the model.
_CAPABILITY = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/audio/transcriptions": "transcription",
}


def _request_id(scope: Scope) -> bytes:
    """Keep a caller's request id when it is sane, so traces join up; otherwise mint one."""
    given = header(scope, b"x-request-id")
    if given is not None and _REQUEST_ID.match(given):
        return given
    return uuid.uuid4().hex.encode()


def authenticate(scope: Scope, policy: Policy) -> Principal:
    authorization = header(scope, b"authorization")
    if not authorization:
        raise errors.missing_key()
    scheme, _, token = authorization.partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        raise errors.missing_key()
    principal = policy.principal_for(hashlib.sha256(token).hexdigest())
    if principal is None or principal.expired(time.time()):
        raise errors.invalid_key()
    return principal


def resolve_model(policy: Policy, principal: Principal, name: object, capability: str) -> Model:
    if not isinstance(name, str) or not name:
        raise errors.bad_request("'model' is required and must be a string.", param="model")
    model = policy.models.get(name)
    if model is None:
        raise errors.not_found(
            f"The model '{name}' does not exist or you do not have access to it.",
            code="model_not_found",
        )
    if name not in principal.models:
        raise GatewayError(
            403,
            f"Use case '{principal.use_case}' is not approved for model '{name}'.",
            type="permission_error",
            code="model_not_allowed",
            param="model",
        )
    if capability not in model.capabilities:
        raise errors.bad_request(
            f"The model '{name}' does not support {capability}.",
            param="model",
            code="unsupported_capability",
        )
    return model


def parse_json_object(body: bytes) -> dict[str, Any]:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise errors.bad_request(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise errors.bad_request("The request body must be a JSON object.")
    return document


def validate_request(path: str, document: dict[str, Any]) -> None:
    """The checks the gateway itself must make; vLLM validates the rest in its own words."""
    if path == "/v1/chat/completions":
        messages = document.get("messages")
        if not isinstance(messages, list) or not messages:
            raise errors.bad_request("'messages' must be a non-empty array.", param="messages")
    elif path == "/v1/completions":
        if "prompt" not in document:
            raise errors.bad_request("'prompt' is required.", param="prompt")
    elif path == "/v1/embeddings" and "input" not in document:
        raise errors.bad_request("'input' is required.", param="input")
    stream = document.get("stream", False)
    if not isinstance(stream, bool):
        raise errors.bad_request("'stream' must be a boolean.", param="stream")
    # Clients never set their own rank: priority comes from policy only.
    if "priority" in document:
        raise errors.bad_request(
            "'priority' is set by the gateway from your use case's policy, not by clients.",
            param="priority",
        )


class Gateway:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.valkey = avalkey.Valkey.from_url(settings.valkey_url)
        self.policy = PolicyStore(
            self.valkey,
            refresh_s=settings.policy_refresh_s,
            max_staleness_s=settings.policy_max_staleness_s,
        )
        self.upstream = Upstream(
            connect_timeout_s=settings.upstream_connect_timeout_s,
            max_connections=settings.upstream_max_connections,
        )
        self._background: list[asyncio.Task[None]] = []
        self._routes: dict[
            tuple[str, str], Callable[[Scope, Receive, Send, bytes], Awaitable[None]]
        ] = {
            ("GET", "/v1/models"): self.list_models,
            ("POST", "/v1/chat/completions"): self.forward,
            ("POST", "/v1/completions"): self.forward,
            ("POST", "/v1/embeddings"): self.forward,
            ("POST", "/v1/audio/transcriptions"): self.forward,
            ("GET", "/healthz"): self.health,
        }
        self._paths = {path for _, path in self._routes}

    # --- ASGI ---------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.handle_http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        await self.upstream.start()
        try:
            await self.policy.refresh()
        except Exception as exc:
            logger.warning("policy_initial_load_failed error=%r", exc)
        self._background.append(asyncio.create_task(self.policy.run()))

    async def shutdown(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.upstream.close()
        await self.valkey.aclose()

    async def handle_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = _request_id(scope)
        path: str = scope["path"]
        handler = self._routes.get((scope["method"], path))
        try:
            if handler is None:
                if path in self._paths:
                    raise GatewayError(405, f"Method {scope['method']} is not allowed on {path}.")
                raise errors.not_found(f"Unknown path {path}.")
            await handler(scope, receive, send, request_id)
        except GatewayError as exc:
            await send_response(
                send, exc.status, exc.body(), headers=[(b"x-request-id", request_id), *exc.headers]
            )
        except (ClientGone, _AbortResponse):
            # Nothing more can be said to this client; returning without finishing the
            # response makes the server drop the connection, which a client reads as a cut.
            return
        except Exception:
            logger.exception("unhandled_error request_id=%s", request_id.decode())
            failure = GatewayError(
                500, "Internal gateway error.", type="api_error", code="internal_error"
            )
            await send_response(send, 500, failure.body(), headers=[(b"x-request-id", request_id)])

    # --- handlers -----------------------------------------------------------------------
    async def health(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        policy = self.policy.current()
        body = orjson.dumps({"status": "ok", "policy_version": policy.version})
        await send_response(send, 200, body, headers=[(b"x-request-id", request_id)])

    async def list_models(
        self, scope: Scope, receive: Receive, send: Send, request_id: bytes
    ) -> None:
        policy = self.policy.current()
        principal = authenticate(scope, policy)
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "switchyard"}
            for name in sorted(principal.models)
            if name in policy.models
        ]
        body = orjson.dumps({"object": "list", "data": data})
        await send_response(send, 200, body, headers=[(b"x-request-id", request_id)])

    async def forward(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        policy = self.policy.current()
        principal = authenticate(scope, policy)
        path: str = scope["path"]
        if path == "/v1/audio/transcriptions":
            model, body, content_type = await self._read_upload(scope, receive, policy, principal)
        else:
            body = await read_body(receive, self.settings.max_body_bytes)
            document = parse_json_object(body)
            validate_request(path, document)
            model = resolve_model(policy, principal, document.get("model"), _CAPABILITY[path])
            content_type = b"application/json"
            if model.served_name != model.public_id:
                document["model"] = model.served_name
                body = orjson.dumps(document)
        headers = {"content-type": content_type.decode(), "x-request-id": request_id.decode()}

        relay = asyncio.ensure_future(self._relay(model, path, body, headers, send, request_id))
        gone = asyncio.ensure_future(_wait_for_disconnect(receive))
        try:
            await asyncio.wait((relay, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not relay.done():
                # The client went away: cancelling the relay closes the upstream connection,
                # which makes vLLM abort the request and free its slot.
                relay.cancel()
            gone.cancel()
        try:
            await relay
        except asyncio.CancelledError:
            if not gone.cancelled() and gone.done():
                logger.info("client_disconnected request_id=%s", request_id.decode())
                return
            raise

    async def _read_upload(
        self, scope: Scope, receive: Receive, policy: Policy, principal: Principal
    ) -> tuple[Model, bytes, bytes]:
        """A transcription upload: a bounded multipart body with ``model`` and ``file``."""
        content_type = header(scope, b"content-type")
        if content_type is None or not is_multipart(content_type):
            raise errors.bad_request(
                "Send the audio as multipart/form-data with 'file' and 'model' fields."
            )
        body = await read_body(receive, self.settings.max_upload_bytes)
        try:
            form = parse_form(content_type, body)
        except FormError as exc:
            raise errors.bad_request(f"The multipart body is malformed: {exc}") from None
        if "file" not in form.files:
            raise errors.bad_request("'file' is required.", param="file")
        model = resolve_model(policy, principal, form.fields.get("model"), "transcription")
        if model.served_name != model.public_id:
            form.fields["model"] = model.served_name
            content_type, body = encode_form(form)
        return model, body, content_type

    async def _relay(
        self,
        model: Model,
        path: str,
        body: bytes,
        headers: dict[str, str],
        send: Send,
        request_id: bytes,
    ) -> None:
        started = False
        replica = ""
        try:
            async with asyncio.timeout(model.timeout_s):
                replica, response = await self.upstream.post(model, path, body, headers)
                try:
                    content_type = response.headers.get("content-type", "application/json")
                    await send(
                        {
                            "type": "http.response.start",
                            "status": response.status,
                            "headers": [
                                (b"content-type", content_type.encode()),
                                (b"x-request-id", request_id),
                            ],
                        }
                    )
                    started = True
                    async for chunk in response.content.iter_any():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b""})
                finally:
                    response.close()
                    self.upstream.done(replica)
        except TimeoutError:
            if started:
                raise _AbortResponse from None
            raise GatewayError(
                504,
                f"Model '{model.public_id}' did not answer within {model.timeout_s:g}s.",
                type="timeout_error",
                code="upstream_timeout",
            ) from None
        except aiohttp.ClientError as exc:
            if started:
                # Headers are out; the only honest signal left is to cut the stream.
                logger.warning(
                    "upstream_broke_mid_response request_id=%s replica=%s error=%s",
                    request_id.decode(),
                    replica,
                    exc.__class__.__name__,
                )
                raise _AbortResponse from None
            raise GatewayError(
                502,
                f"The replica serving '{model.public_id}' failed: {exc.__class__.__name__}.",
                type="api_error",
                code="upstream_error",
            ) from None


class _AbortResponse(Exception):
    """The response had started; end it by dropping the connection so the client sees a cut."""


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def create_app(settings: GatewaySettings | None = None) -> Gateway:
    return Gateway(settings or GatewaySettings.from_env())
