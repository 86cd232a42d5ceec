"""The gateway: a lean, pure-ASGI, OpenAI-compatible front door to the vLLM fleet.

Per request it does only in-memory work (authenticate against the policy snapshot, validate
the body) before forwarding over a pooled connection; the database is never touched and the
only I/O is the upstream call itself. Streams are relayed chunk by chunk and the upstream is
always closed — on completion, on error and when the client goes away.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from config.valkey_urls import VALKEY_FAILURES, async_client, is_cluster
from gateway import control_proxy, errors, openapi
from gateway.accounting import Accounting, Usage
from gateway.admission import estimated_tokens, reconcile_args
from gateway.async_tasks import layout as async_layout
from gateway.autopipeline import Arg, auto_pipeline
from gateway.costs import (
    Estimate,
    estimate_json_request,
    estimate_transcription,
    max_tokens_override,
)
from gateway.errors import GatewayError
from gateway.guardrail_stream import GuardedStream
from gateway.guardrails import (
    FleetCaller,
    GuardPlan,
    Guardrails,
    ServiceClient,
    blocked_message,
    request_slots,
)
from gateway.http import (
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_response,
    with_member,
)
from gateway.logcontext import REQUEST_ID
from gateway.metrics import Decision, GatewayMetrics
from gateway.multipart import Form, FormError, encode_form, is_multipart, parse_form
from gateway.policy import DEFAULT_RECORD_POLICY, Model, Policy, Principal, RecordPolicy
from gateway.policy_store import PolicyStore
from gateway.records import (
    EMPTY_CONTENT,
    Recorder,
    capped,
    file_digests,
    upload_description,
)
from gateway.response_stage import Transcript, check_answer, keep_record
from gateway.scheduling import (
    Grant,
    MaxConcurrent,
    QueueFull,
    QueueTimeout,
    RateLimited,
    Scheduler,
    SchedulingRefused,
    Ticket,
    TicketPlans,
    prefix_hash,
    saturated_entry,
    write_fleet,
)
from gateway.service_accounts import KeysUnavailable, TokenRefused, TokenVerifier
from gateway.settings import GatewaySettings
from gateway.upstream import ReplicaUnreachable, Upstream, UpstreamError
from gateway.usage import UsageEventFilter, UsageMeter, asks_for_usage, with_usage_requested

logger = logging.getLogger("gateway")

_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._-]{1,128}$")

# The counts the model's cap and the token estimate read: integers or null, nothing else.
_INTEGER_PARAMETERS = ("max_tokens", "max_completion_tokens", "n", "best_of")

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
    return minted_id().encode()


def minted_id() -> str:
    """32 hex digits, all 128 bits random: record ids go back to clients and into the portal's
    URLs, so one must say nothing about another (a tag plus a counter gave every id away).
    os.urandom is the kernel's CSPRNG, as secrets uses, at a fraction of a microsecond."""
    return os.urandom(16).hex()


def authenticate(
    scope: Scope, policy: Policy, tokens: TokenVerifier | None = None
) -> Principal | None:
    """The caller, from an API key or (with a realm configured) a Keycloak service-account
    token; a GatewayError when refused. Never waits: None only for a token signed by a key
    not fetched yet, when ``authenticate_after_key_fetch`` is what to await."""
    token = _bearer_token(scope)
    if tokens is not None and token.count(b".") == 2:  # a JWT; keys never hold a dot
        try:
            verified = tokens.verify(token)
        except (TokenRefused, KeysUnavailable) as exc:
            raise _token_refused(exc) from None
        return None if verified is None else _service_account(policy, verified.client_id)
    principal = policy.principal_for(hashlib.sha256(token).hexdigest())
    if principal is None or principal.expired(time.time()):
        raise errors.invalid_key()
    return principal


def _bearer_token(scope: Scope) -> bytes:
    """The credential of ``Authorization: Bearer <credential>``; 401 without one."""
    authorization = header(scope, b"authorization")
    if not authorization:
        raise errors.missing_key()
    scheme, _, token = authorization.partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        raise errors.missing_key()
    return token


async def authenticate_after_key_fetch(
    scope: Scope, policy: Policy, tokens: TokenVerifier | None
) -> Principal:
    """The rare path: a token names a signing key the gateway has not fetched yet (Keycloak
    rotated its keys). Refetch the realm's keys, at most every 30 s, and verify once more."""
    token = _bearer_token(scope)
    if tokens is None:
        raise errors.invalid_key()
    try:
        verified = await tokens.verify_after_fetch(token)
    except (TokenRefused, KeysUnavailable) as exc:
        raise _token_refused(exc) from None
    return _service_account(policy, verified.client_id)


def _service_account(policy: Policy, client_id: str) -> Principal:
    # Looked up on every request, not remembered with the token: a suspended use case's
    # client stops at the next snapshot, as its keys do.
    principal = policy.service_accounts.get(client_id)
    if principal is None:
        raise GatewayError(
            401,
            f"The service account of client {client_id!r} is bound to no approved use case.",
            code="invalid_api_key",
        )
    return principal


def _token_refused(exc: TokenRefused | KeysUnavailable) -> GatewayError:
    if isinstance(exc, KeysUnavailable):
        return errors.service_unavailable(
            f"{exc} Retry shortly.", code="identity_provider_unavailable", retry_after_s=5
        )
    return GatewayError(
        401,
        str(exc),
        code="invalid_api_key",
        headers=[(b"www-authenticate", b'Bearer realm="switchyard", error="invalid_token"')],
    )


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
    # vLLM would read "100000" or 5.0 as a count; the model's cap and the token estimate
    # (gateway/costs.py) read integers only, so anything else is refused, not passed on.
    for name in _INTEGER_PARAMETERS:
        value = document.get(name)
        if value is not None and type(value) is not int:  # bool is not an integer here
            raise errors.bad_request(
                f"'{name}' must be an integer.", param=name, code="invalid_type"
            )
    # Clients never set their own rank: priority comes from policy only.
    if "priority" in document:
        raise errors.bad_request(
            "'priority' is set by the gateway from your use case's policy, not by clients.",
            param="priority",
        )


class Gateway:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.valkey = async_client(settings.valkey_url)
        self.policy = PolicyStore(
            self.valkey,
            refresh_s=settings.policy_refresh_s,
            max_staleness_s=settings.policy_max_staleness_s,
        )
        self.upstream = Upstream(
            connect_timeout_s=settings.upstream_connect_timeout_s,
            max_connections=settings.upstream_max_connections,
        )
        self.metrics = GatewayMetrics()
        self._plans = TicketPlans()
        self.scheduler = Scheduler(
            self.valkey,
            pipe=auto_pipeline(self.valkey),  # one server, Sentinel or Cluster
            lease_ms=int(settings.lease_s * 1000),
            heartbeat_ms=int(settings.heartbeat_s * 1000),
            stale_ms=int(settings.fleet_stale_s * 1000),
            waiting_threshold=settings.backpressure_waiting,
            long_prompt_tokens=settings.long_prompt_tokens,
            # A Valkey Cluster: each slot charged by its own script (docs/gateway-scheduling.md)
            split_slots=is_cluster(settings.valkey_url),
        )
        # One connection for the hot path's scripts and the accounting streams.
        self.accounting = Accounting(
            self.valkey,
            metrics=self.metrics,
            # WAIT blocks its connection: the writer gets its own when it waits for replicas.
            pipe=None if settings.usage_replicas else self.scheduler.pipe,
            content_budget_bytes=settings.record_buffer_bytes,
            replicas=settings.usage_replicas,
            replica_timeout_ms=settings.usage_replica_timeout_ms,
        )
        self.guardrails = Guardrails(
            service=ServiceClient(
                self.upstream,
                settings.guardrail_url,
                settings.guardrail_timeout_s,
                token=settings.guardrail_token,
                max_text_chars=settings.guardrail_max_text_chars,
            ),
            fleet=FleetCaller(self.policy, self.scheduler, self.upstream),
            metrics=self.metrics,
            accounting=self.accounting,
            retry_after_s=settings.guardrail_retry_after_s,
        )
        # Keycloak service-account tokens on /v1, when a realm is configured.
        self.tokens = (
            TokenVerifier(settings.service_accounts) if settings.service_accounts else None
        )
        # /v1/files and /v1/batches, served by the web process (gateway/control_proxy.py).
        self.control = control_proxy.ControlProxy(
            settings.control_url,
            max_body_bytes=settings.control_max_body_bytes,
            timeout_s=settings.control_timeout_s,
        )
        # The async task API (gateway/async_tasks/), which builds on this class: imported here
        # because its module imports this one.
        from gateway.async_tasks.api import AsyncTasks

        self.async_tasks = AsyncTasks(self)
        # The /v1 contract, serialised once here: its route answers these bytes as they are.
        self._openapi = openapi.load()
        self._background: list[asyncio.Task[None]] = []
        self._routes: dict[
            tuple[str, str], Callable[[Scope, Receive, Send, bytes], Awaitable[None]]
        ] = {
            ("GET", "/v1/models"): self.list_models,
            ("POST", "/v1/chat/completions"): self.forward,
            ("POST", "/v1/completions"): self.forward,
            ("POST", "/v1/embeddings"): self.forward,
            ("POST", "/v1/audio/transcriptions"): self.forward,
            ("GET", openapi.PATH): self.openapi_document,
            ("GET", "/healthz"): self.health,
            ("GET", "/metrics"): self.prometheus,
        }
        for path in async_layout.ENDPOINTS:
            self._routes[("POST", path)] = self.async_tasks.submit
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
        await self.scheduler.start()
        await self.accounting.start()
        self.async_tasks.start()
        if self.tokens is not None:
            await self.tokens.start()
        try:
            await self.policy.refresh()
        except Exception as exc:
            logger.warning("policy_initial_load_failed error=%r", exc)
        self._background.append(asyncio.create_task(self.policy.run()))
        # Everything loaded so far (modules, clients, the first snapshot) lives as long as
        # the process: keep it out of the collector's full passes, which otherwise walk it
        # all and stall every request in flight for tens of milliseconds on a small VM.
        gc.collect()
        gc.freeze()

    async def shutdown(self) -> None:
        self.policy.stop()
        for task in self._background:
            task.cancel()
        if self._background:
            # Bounded: a cancellation swallowed inside a client library must not hang shutdown.
            await asyncio.wait(self._background, timeout=self.settings.policy_refresh_s + 2)
        if self.tokens is not None:
            await self.tokens.close()
        await self.async_tasks.close()
        await self.accounting.close()
        await self.scheduler.close()
        await self.upstream.close()
        await self.control.close()
        await self.valkey.aclose()

    async def handle_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = _request_id(scope)
        # Every log line of this request (and of the tasks it starts) carries the id.
        REQUEST_ID.set(request_id.decode())
        path: str = scope["path"]
        handler = self._routes.get((scope["method"], path))
        try:
            if handler is None:
                # Only paths with no route of their own reach this: it costs the hot path nothing.
                if path.startswith(async_layout.TASKS_PATH_PREFIX):
                    if scope["method"] != "GET":
                        raise GatewayError(
                            405, f"Method {scope['method']} is not allowed on {path}."
                        )
                    await self.async_tasks.poll(scope, receive, send, request_id)
                    return
                if control_proxy.handles(path):
                    await self.control.forward(scope, receive, send, request_id)
                    return
                if path in self._paths:
                    raise GatewayError(405, f"Method {scope['method']} is not allowed on {path}.")
                raise errors.not_found(f"Unknown path {path}.")
            await handler(scope, receive, send, request_id)
        except GatewayError as exc:
            await send_response(
                send, exc.status, exc.body(), headers=[(b"x-request-id", request_id), *exc.headers]
            )
        except BodyTooLarge as exc:
            too_large = GatewayError(
                413, f"Request body is larger than {exc.limit} bytes.", code="request_too_large"
            )
            await send_response(
                send, 413, too_large.body(), headers=[(b"x-request-id", request_id)]
            )
        except (ClientGone, _AbortResponse):
            # Nothing more can be said to this client; returning without finishing the
            # response makes the server drop the connection, which a client reads as a cut.
            return
        except Exception:
            logger.exception("unhandled_error")
            failure = _internal_error()
            await send_response(send, 500, failure.body(), headers=[(b"x-request-id", request_id)])

    # --- handlers -----------------------------------------------------------------------
    async def health(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        policy = self.policy.current()
        body = orjson.dumps({"status": "ok", "policy_version": policy.version})
        await send_response(send, 200, body, headers=[(b"x-request-id", request_id)])

    async def openapi_document(
        self, scope: Scope, receive: Receive, send: Send, request_id: bytes
    ) -> None:
        """The /v1 contract (gateway/openapi.yaml); public, as OpenAI's own is."""
        await send_response(send, 200, self._openapi, headers=[(b"x-request-id", request_id)])

    async def prometheus(
        self, scope: Scope, receive: Receive, send: Send, request_id: bytes
    ) -> None:
        accept = header(scope, b"accept")
        for (model, priority_class), depth in self.scheduler.queue_depths().items():
            self.metrics.set_queue_depth(model=model, priority_class=priority_class, depth=depth)
        body, content_type = self.metrics.render(accept.decode("latin-1") if accept else None)
        await send_response(send, 200, body, content_type=content_type.encode())

    async def list_models(
        self, scope: Scope, receive: Receive, send: Send, request_id: bytes
    ) -> None:
        policy = self.policy.current()
        principal = authenticate(scope, policy, self.tokens)
        if principal is None:  # a token signed by a key not fetched yet
            principal = await authenticate_after_key_fetch(scope, policy, self.tokens)
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "switchyard"}
            for name in sorted(principal.models)
            if name in policy.models
        ]
        body = orjson.dumps({"object": "list", "data": data})
        await send_response(send, 200, body, headers=[(b"x-request-id", request_id)])

    async def forward(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        """Authenticate, validate, admit (limits and queue, one call), relay, account."""
        started = time.monotonic()
        policy = self.policy.current()
        principal = authenticate(scope, policy, self.tokens)
        if principal is None:  # a token signed by a key not fetched yet
            principal = await authenticate_after_key_fetch(scope, policy, self.tokens)
        call = await self._read_call(scope, receive, policy, principal, request_id)
        # The one lookup a use case without full records pays.
        call.record = policy.records.get(principal.use_case_id, DEFAULT_RECORD_POLICY)
        if call.record == "full":
            # What the client receives, errors included, is what the transcript keeps.
            send = call.recorder = Recorder(send, self.settings.record_max_content_bytes)
            if call.form is not None:
                # Hashed in a thread, beside the upstream call: an upload is up to 25 MiB.
                loop = asyncio.get_running_loop()
                call.digests = loop.run_in_executor(None, file_digests, call.form)
        try:
            self.plan_ticket(call, policy)
            # The one lookup a use case without guardrails pays.
            guard = policy.guarded.get(principal.use_case_id)
            if guard is not None:
                call.guard = guard
                if guard.request is not None:
                    await self.check_request(call, guard, policy)
            # One watcher per request: a client that goes away cancels this task, which
            # leaves the queue or closes the upstream (vLLM then aborts and frees its slot).
            handler = asyncio.current_task()
            assert handler is not None
            call.handler = handler
            watcher = asyncio.ensure_future(_interrupt_on_disconnect(receive, call))
            try:
                await self._serve(call, send)
            except asyncio.CancelledError:
                if call.interrupted == "client" and handler.uncancel() == 0:
                    call.status = 499
                    logger.info("client_disconnected")
                    return
                raise
            finally:
                watcher.cancel()
        except GatewayError as exc:
            call.status = exc.status
            await self._refuse(call, send, exc)
        except (ClientGone, _AbortResponse):
            raise
        except Exception:
            if call.started:
                raise  # the head is out: handle_http drops the connection
            logger.exception("unhandled_error")
            call.status = 500
            await self._refuse(call, send, _internal_error())
        finally:
            try:
                if call.digests is not None:
                    await asyncio.wait((call.digests,))
            finally:
                self._account(call, policy, started)

    async def _refuse(self, call: Call, send: Send, exc: GatewayError) -> None:
        """A request refused or failed after it became a Call: answered here rather than by
        handle_http, so that the answer carries its record id and is out (and, for a full
        record, captured) before the request is accounted."""
        headers = [
            (b"x-request-id", call.request_id_bytes),
            (b"x-switchyard-record-id", call.record_id_bytes),
            *exc.headers,
        ]
        await send_response(send, exc.status, exc.body(), headers=headers)

    async def _read_call(
        self,
        scope: Scope,
        receive: Receive,
        policy: Policy,
        principal: Principal,
        request_id: bytes,
    ) -> Call:
        path: str = scope["path"]
        document: dict[str, Any] | None = None
        form: Form | None = None
        strip_usage = per_replica = False
        if path == "/v1/audio/transcriptions":
            model, form, body, content_type, estimate = await self._read_upload(
                scope, receive, policy, principal
            )
            per_replica = bool(model.served_names)
        else:
            body = await read_body(receive, self.settings.max_body_bytes)
            document = parse_json_object(body)
            validate_request(path, document)
            model = resolve_model(policy, principal, document.get("model"), _CAPABILITY[path])
            content_type = b"application/json"
            estimate = estimate_json_request(path, document, len(body), model.max_tokens)
            body, strip_usage, per_replica = _upstream_body(path, body, document, model)
        record_id = minted_id()
        return Call(
            request_id=request_id.decode(),
            request_id_bytes=request_id,
            record_id=record_id,
            record_id_bytes=record_id.encode(),
            principal=principal,
            model=model,
            path=path,
            body=body,
            document=document,
            form=form,
            content_type=content_type,
            streaming=bool(document and document.get("stream")),
            estimate=estimate,
            strip_usage=strip_usage,
            rename_per_replica=per_replica,
        )

    async def _read_upload(
        self, scope: Scope, receive: Receive, policy: Policy, principal: Principal
    ) -> tuple[Model, Form, bytes, bytes, Estimate]:
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
        estimate = estimate_transcription(form.files["file"].data)
        if model.served_name != model.public_id and not model.served_names:
            form.fields["model"] = model.served_name
            content_type, body = encode_form(form)
        return model, form, body, content_type, estimate

    def plan_ticket(self, call: Call, policy: Policy) -> None:
        """What acquire needs: the rate limits with this request's token estimate, and the
        queue's view of it (rank, fair-share cost, prefix affinity). No I/O."""
        call.ticket = self._plans.plan(policy, call.principal, call.model).ticket(
            request_id=call.request_id,
            # Fair sharing weighs requests by tokens whether or not a token limit applies.
            cost=call.estimate.total,
            prefix_hash=prefix_hash(_prefix_text(call.document)),
            prompt_tokens=call.estimate.prompt,
        )

    async def check_request(self, call: Call, guard: GuardPlan, policy: Policy) -> None:
        """Request guardrails, after the rate limits (judged, not counted: acquire counts
        them) and before the request takes a replica's capacity. Blocks (400), rewrites
        the body (redact), or lets it through (flag); 503 when a check cannot run and the use
        case fails closed. What the checks cannot read as text is refused first (400)."""
        checks, document = guard.request, call.document
        assert checks is not None
        assert call.ticket is not None
        # A JSON body, or an upload's form fields (a transcription's prompt).
        fields = call.form.fields if call.form is not None else None
        readable = document if document is not None else fields
        assert readable is not None
        slots = request_slots(call.path, readable)
        try:
            await self.scheduler.check_limits(call.ticket)
        except RateLimited as refused:
            self._decided(
                call, "rejected", f"rate_limit:{refused.limit.name}", refused.retry_after_s
            )
            raise refusal(429, "rate_limit_error", refused, code="rate_limit_exceeded") from None
        except VALKEY_FAILURES as exc:
            raise admission_unavailable(exc) from None
        if not slots:
            return
        texts = [container[key] for container, key, _ in slots]
        if checks.service and (over := self.guardrails.service.over_budget(texts)) is not None:
            raise over
        result = await self.guardrails.run(checks, texts, document)
        self.guardrails.record(
            call,
            stage="request",
            findings=result.findings,
            failed=result.failed,
            failure=guard.failure,
            policy_version=policy.version,
        )
        if result.texts != texts:
            # Also when blocked: a full record keeps the refused request as redacted.
            for (container, key, _), text in zip(slots, result.texts, strict=True):
                container[key] = text
            if call.rename_per_replica:
                pass  # the body is made at the grant
            elif document is not None:
                call.body = _redacted_body(call, document)
            elif call.form is not None:
                call.content_type, call.body = encode_form(call.form)
        if result.blocked is not None:
            raise GatewayError(
                400, blocked_message(result.blocked, "request"), code="guardrail_blocked"
            )
        if result.failed and guard.failure == "closed":
            # Refused because a check (a redaction, maybe) could not run: nothing was sent
            # on, and a full record must not keep text a redaction was to take out.
            call.request_withheld = True
            raise self.guardrails.unavailable("request", result.failed)

    async def _serve(self, call: Call, send: Send) -> None:
        """Acquire capacity (rate limits included), relay from the granted replica; fail over
        if it is unreachable."""
        ticket = call.ticket
        assert ticket is not None
        for _ in range(max(len(call.model.replicas), 1)):
            grant = await self._acquire(call, ticket)
            try:
                async with self.scheduler.keep_alive(
                    grant,
                    lambda: self._reconciliation(call),
                    wait_for_release=False,
                    refund_on=(ReplicaUnreachable,),
                ):
                    await self._relay(call, grant, send)
                    return
            except ReplicaUnreachable as exc:
                # Nothing reached vLLM: the grant was refunded on the way out. Tell every
                # gateway at once (the watcher confirms or clears it on its next scrape) and
                # ask the scheduler for another replica, charged afresh: a request is charged
                # once, by the attempt a replica took (or by none).
                try:
                    await write_fleet(
                        self.valkey,
                        call.model.public_id,
                        {exc.replica: saturated_entry(scraped_at_ms=self.scheduler.now_ms())},
                    )
                except VALKEY_FAILURES as failed:
                    raise admission_unavailable(failed) from None
        raise GatewayError(
            502,
            f"No replica of model '{call.model.public_id}' could be reached.",
            type="api_error",
            code="upstream_unavailable",
        )

    async def _acquire(self, call: Call, ticket: Ticket) -> Grant:
        try:
            grant = await self.scheduler.acquire(ticket)
        except RateLimited as refused:
            self._decided(
                call, "rejected", f"rate_limit:{refused.limit.name}", refused.retry_after_s
            )
            raise refusal(429, "rate_limit_error", refused, code="rate_limit_exceeded") from None
        except MaxConcurrent as refused:
            self._decided(call, "rejected", refused.code, refused.retry_after_s)
            raise refusal(429, "rate_limit_error", refused) from None
        except (QueueFull, QueueTimeout) as refused:
            decision: Decision = "rejected" if isinstance(refused, QueueFull) else "shed"
            self._decided(call, decision, refused.code, refused.retry_after_s)
            raise refusal(503, "service_unavailable", refused) from None
        except VALKEY_FAILURES as exc:
            raise admission_unavailable(exc) from None
        call.admitted_ms = grant.admitted_ms  # this grant's charge is the one reconciled
        call.grant = grant
        if grant.queued:
            self.metrics.queue_waited(
                model=call.model.public_id,
                priority_class=ticket.priority_class,
                seconds=grant.queued_ms / 1000,
            )
        return grant

    def _reconciliation(self, call: Call) -> Sequence[Arg]:
        """At release: correct the token windows by what the request really used. (An attempt
        no replica took is refunded instead: ``keep_alive``'s ``refund_on``.)"""
        meter, ticket = call.meter, call.ticket
        if meter is None or ticket is None or not ticket.limits:
            return ()
        estimated = estimated_tokens(ticket.limits)
        if not estimated:
            return ()
        actual = (
            meter.prompt_tokens + meter.completion_tokens
            if meter.reported or meter.streaming
            else estimated
        )
        return reconcile_args(ticket.limits, admitted_ms=call.admitted_ms, actual_tokens=actual)

    async def _relay(self, call: Call, grant: Grant, send: Send) -> None:
        model = call.model
        body, content_type = call.body, call.content_type
        if call.form is not None and call.rename_per_replica:
            call.form.fields["model"] = model.served_name_for(grant.replica)
            content_type, body = encode_form(call.form)
        if call.document is not None:
            if call.rename_per_replica:
                # The model's deployments serve it under different names: the granted
                # replica's, now that it is known.
                call.document["model"] = model.served_name_for(grant.replica)
                body = orjson.dumps(call.document)
            if call.recorder is not None:
                call.request_sent = body  # as forwarded, less the gateway's priority
            # The class's priority, for replicas running vLLM's priority scheduler (others
            # accept and ignore it); clients cannot set it (validate_request refuses).
            body = with_priority(body, grant.vllm_priority)
        # vLLM makes its request id (and the completion's ``id``) from X-Request-Id: it gets
        # the lease's id, unique per attempt, never the client's own, which may repeat (some
        # vLLM versions refuse a duplicate of a running id) or be chosen to collide with
        # another tenant's. The client's id stays in logs, records and the response.
        headers = ((b"content-type", content_type), (b"x-request-id", grant.lease_id.encode()))
        meter = UsageMeter(streaming=call.streaming)
        started = False
        self.metrics.in_flight_changed(model=model.public_id, replica=grant.replica, delta=1)
        upstream_started = time.monotonic()
        # The model's timeout as one timer that interrupts this task (cheaper per request
        # than asyncio.timeout); cancelling the task closes the upstream connection. One
        # deadline for the request, from its first attempt: a failover does not extend it.
        loop = asyncio.get_running_loop()
        if call.deadline is None:
            call.deadline = loop.time() + model.timeout_s
        timer = loop.call_at(call.deadline, call.interrupt, "timeout")
        try:
            call.forwarded = True  # from here on the replica may be working on it
            response = await self.upstream.post(grant.replica, call.path, body, headers)
            call.meter = meter  # a replica answers: from here on its usage counts
            try:
                call.status = response.status
                guard = call.guard
                if guard is not None and guard.response is not None and response.status == 200:
                    try:
                        await self._relay_checked(call, guard, response, meter, send)
                    finally:
                        started = call.responded or call.started
                    return
                response_headers = [
                    (b"content-type", response.content_type),
                    (b"x-request-id", call.request_id_bytes),
                    (b"x-switchyard-record-id", call.record_id_bytes),
                ]
                strip = (
                    UsageEventFilter()
                    if call.strip_usage
                    and response.status == 200
                    and b"event-stream" in response.content_type
                    else None
                )
                if response.content_length is not None and strip is None:
                    # The body goes through unchanged: its length too, so the client gets
                    # it in one write instead of HTTP chunks.
                    response_headers.append((b"content-length", response.content_length))
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status,
                        "headers": response_headers,
                    }
                )
                started = call.started = True
                more = True
                while more and (chunk := await response.read()):
                    if meter.first_chunk_at is None:
                        meter.first_chunk_at = time.monotonic()
                    meter.feed(chunk)
                    # The last bytes go out with the end of the response: one write fewer.
                    more = not response.done
                    if strip is not None:
                        chunk = strip(chunk) if more else strip(chunk) + strip.flush()
                        if more and not chunk:
                            continue  # only part of an event so far
                    if not more:
                        call.responded = True
                    await send({"type": "http.response.body", "body": chunk, "more_body": more})
                if more:
                    # Every byte is out: a disconnect from here on is not the client leaving.
                    call.responded = True
                    rest = strip.flush() if strip is not None else b""
                    await send({"type": "http.response.body", "body": rest})
            finally:
                response.close()
        except asyncio.CancelledError:
            if call.interrupted != "timeout" or call.uncancel() > 0:
                raise
            if started:
                raise _AbortResponse from None
            raise GatewayError(
                504,
                f"Model '{model.public_id}' did not answer within {model.timeout_s:g}s.",
                type="timeout_error",
                code="upstream_timeout",
            ) from None
        except ReplicaUnreachable:
            call.forwarded = False  # nothing reached vLLM
            raise
        except UpstreamError as exc:
            if started:
                # Headers are out; the only honest signal left is to cut the stream.
                logger.warning(
                    "upstream_broke_mid_response replica=%s error=%s",
                    grant.replica,
                    exc.__class__.__name__,
                )
                raise _AbortResponse from None
            raise GatewayError(
                502,
                f"The replica serving '{model.public_id}' failed: {exc.__class__.__name__}.",
                type="api_error",
                code="upstream_error",
            ) from None
        finally:
            timer.cancel()
            call.upstream_s = time.monotonic() - upstream_started
            if meter.first_chunk_at is not None:
                call.ttft_s = meter.first_chunk_at - upstream_started
            meter.finish(prompt_estimate=call.estimate.prompt)
            self.metrics.in_flight_changed(model=model.public_id, replica=grant.replica, delta=-1)

    async def _relay_checked(
        self, call: Call, guard: GuardPlan, response: Any, meter: UsageMeter, send: Send
    ) -> None:
        """A 200 answer under response guardrails: read whole and checked (then sent as it
        is, redacted, or refused with 422), or, streamed, windowed (gateway/guardrail_stream)."""
        checks = guard.response
        assert checks is not None
        headers = [
            (b"content-type", response.content_type),
            (b"x-request-id", call.request_id_bytes),
            (b"x-switchyard-record-id", call.record_id_bytes),
        ]
        if call.path == "/v1/embeddings":
            checks = None  # an embedding answer has no text to check
        if not call.streaming or b"event-stream" not in response.content_type:
            parts = []
            while chunk := await response.read():
                if meter.first_chunk_at is None:
                    meter.first_chunk_at = time.monotonic()
                meter.feed(chunk)
                parts.append(chunk)
            body = b"".join(parts)
            if checks is not None:
                body = await self._check_answer(call, guard, body)
            headers.append((b"content-length", str(len(body)).encode()))
            call.started = True
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            call.responded = True
            await send({"type": "http.response.body", "body": body})
            return
        assert checks is not None
        stream = GuardedStream(
            path=call.path,
            checks=checks,
            guardrails=self.guardrails,
            window_chars=guard.window_chars,
            failure=guard.failure,
            strip_usage=call.strip_usage,
            document=call.document,
        )
        call.started = True
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        try:
            while chunk := await response.read():
                if meter.first_chunk_at is None:
                    meter.first_chunk_at = time.monotonic()
                meter.feed(chunk)
                out = await stream.feed(chunk)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                if stream.ended:
                    break  # blocked mid-answer: the caller closes the upstream (vLLM stops)
            out = b"" if stream.ended else await stream.finish()
            call.responded = True
            await send({"type": "http.response.body", "body": out})
        finally:
            self.guardrails.record(
                call,
                stage="response",
                findings=stream.summaries(),
                failed=stream.failed,
                failure=guard.failure,
                policy_version=self.policy.version,
            )

    async def _check_answer(self, call: Call, guard: GuardPlan, body: bytes) -> bytes:
        """A whole answer checked (gateway/response_stage.py, as every door checks one): the
        body to send (redacted or not); 422 when blocked."""
        return await check_answer(
            self.guardrails,
            call,
            path=call.path,
            guard=guard,
            body=body,
            document=call.document,
            policy_version=self.policy.version,
        )

    def _decided(self, call: Call, decision: Decision, reason: str, retry_after_s: int = 0) -> None:
        # The metric's label stays bounded ("rate_limit"); the stream keeps the limit's name.
        self.metrics.admission_decided(decision, reason.split(":", 1)[0])
        self.accounting.record_decision(
            request_id=call.request_id,
            decision=decision,
            reason=reason,
            tenant=call.principal.tenant,
            use_case_id=call.principal.use_case_id,
            key_id=call.principal.key_id,
            model=call.model.public_id,
            wait_ms=call.grant.queued_ms if call.grant else 0,
            policy_version=self.policy.version,
            record_id=call.record_id,
            retry_after_s=retry_after_s,
        )

    def _account(self, call: Call, policy: Policy, started: float) -> None:
        """After every forwarded request: metrics and the usage record (buffered, no I/O)."""
        meter = call.meter
        prompt = meter.prompt_tokens if meter else 0
        completion = meter.completion_tokens if meter else 0
        if (
            call.forwarded
            and call.interrupted
            and not (meter and (meter.reported or meter.streaming))
        ):
            # Cut short (client gone, model timeout) before a plain answer said its usage:
            # the replica was still asked to run the prompt.
            prompt = max(prompt, call.estimate.prompt)
        grant = call.grant
        if grant is not None and grant.queued:
            self._decided(call, "queued", call.ticket.priority_class if call.ticket else "")
        self.metrics.request_finished(
            model=call.model.public_id,
            status=call.status,
            upstream_s=call.upstream_s,
            ttft_s=call.ttft_s,
            prompt_tokens=prompt,
            completion_tokens=completion,
        )
        usage = Usage(
            request_id=call.request_id,
            at_ms=time.time_ns() // 1_000_000,
            tenant=call.principal.tenant,
            use_case_id=call.principal.use_case_id,
            key_id=call.principal.key_id,
            model=call.model.public_id,
            replica=grant.replica if grant else None,
            status=call.status,
            prompt_tokens=prompt,
            completion_tokens=completion,
            queued_ms=grant.queued_ms if grant else 0,
            upstream_ms=(call.upstream_s or 0) * 1000,
            total_ms=(time.monotonic() - started) * 1000,
            policy_version=policy.version,
            record_id=call.record_id,
            endpoint=call.path,
            streamed=call.streaming,
            record=call.record,
        )
        # The record policy, as every door keeps it (gateway/response_stage.py).
        transcript = None if call.recorder is None else self._transcript(call, call.recorder)
        usage = keep_record(self.accounting, usage, transcript)
        self.metrics.record_kept(usage.record)

    def _transcript(self, call: Call, recorder: Recorder) -> Transcript:
        """A full record's content: the request as forwarded (none when withheld) and what
        the client got, as the recorder kept it."""
        if call.request_withheld:
            request, cut = EMPTY_CONTENT, False
        else:
            request, cut = capped(self._request_content(call), recorder.limit)
        return Transcript(
            request=request,
            response=recorder.response,
            response_type=recorder.content_type,
            truncated=cut or recorder.truncated,
        )

    @staticmethod
    def _request_content(call: Call) -> bytes:
        """The request as forwarded (after the request guardrails' redactions), or, not
        forwarded, as it stood when refused; an upload as its description."""
        if call.form is not None:
            digests = call.digests
            found: dict[str, str] = {}
            if (
                digests is not None
                and digests.done()
                and not digests.cancelled()
                and digests.exception() is None
            ):
                found = digests.result()
            return upload_description(call.form, found)
        if call.request_sent is not None:
            return call.request_sent
        if call.rename_per_replica and call.document is not None:
            # ``call.body`` is the client's, unredacted: the body is made at the grant.
            return orjson.dumps(call.document)
        return call.body


@dataclass(slots=True)
class Call:
    """One forwarded request as it moves through admission, the queue and the relay."""

    request_id: str
    request_id_bytes: bytes  # as it goes out in headers
    # The gateway's own id for this request (a client's X-Request-Id may repeat): what joins
    # its usage, decisions, findings and transcript; sent back as x-switchyard-record-id.
    record_id: str
    record_id_bytes: bytes
    principal: Principal
    model: Model
    path: str
    body: bytes
    document: dict[str, Any] | None
    form: Form | None  # a transcription's upload, parsed
    content_type: bytes
    streaming: bool
    estimate: Estimate  # admission's, before it runs (gateway/costs.py)
    strip_usage: bool = False  # the gateway asked for the stream's usage chunk, not the client
    rename_per_replica: bool = False  # the body is made at the grant (Model.served_names)
    forwarded: bool = False  # the body went to a replica (which may be running it)
    status: int = 500
    responded: bool = False  # the whole response is out; a disconnect now is not the client's
    ticket: Ticket | None = None
    admitted_ms: int = 0  # when the serving grant counted the rate limits (for reconcile)
    handler: asyncio.Task[Any] | None = None  # the task serving it, for interrupt()
    interrupted: str | None = None  # "client" (gone mid-request) or "timeout" (the model's)
    grant: Grant | None = None
    meter: UsageMeter | None = None
    upstream_s: float | None = None
    ttft_s: float | None = None
    deadline: float | None = None  # the model's timeout, on the loop's clock, for all attempts
    guard: GuardPlan | None = None  # the use case's guardrails, when it has any
    started: bool = False  # the response's head is out
    record: RecordPolicy = DEFAULT_RECORD_POLICY  # the use case's record policy
    recorder: Recorder | None = None  # a full record's capture of what the client gets
    request_sent: bytes | None = None  # a full record's request, as forwarded
    request_withheld: bool = False  # refused with a redaction unrun: no request content
    digests: asyncio.Future[dict[str, str]] | None = None  # a full record's upload hashes

    def interrupt(self, reason: str) -> None:
        """Cancel the serving task, once, unless the response is already out."""
        if self.interrupted is None and not self.responded and self.handler is not None:
            self.interrupted = reason
            self.handler.cancel()

    def uncancel(self) -> int:
        """Take back interrupt()'s cancellation; > 0 when someone else cancelled too."""
        assert self.handler is not None
        return self.handler.uncancel()


def with_priority(body: bytes, priority: int) -> bytes:
    """The JSON object ``body`` with ``"priority": priority`` added as its last member.

    ``body`` is a validated JSON object without ``priority`` (validate_request)."""
    return with_member(body, b'"priority":%d' % priority)


def _upstream_body(
    path: str, body: bytes, document: dict[str, Any], model: Model
) -> tuple[bytes, bool, bool]:
    """The body as replicas get it, less the priority (added at the grant): the served name,
    the completion bounded by the model's cap, a stream asking for its usage chunk.

    Returns the body, whether the gateway asked for the usage chunk (the relay takes it out
    again for this client), and whether the served name depends on the replica (then the
    body is made at the grant from ``document``, which holds the other changes). New members
    are spliced in; a changed one, or a new name, costs one serialisation."""
    bound = max_tokens_override(path, document, model.max_tokens)
    options = document.get("stream_options")
    # Exact token counts for the records and the token windows: vLLM's usage chunk. A
    # ``stream_options`` that is not an object goes as it is (vLLM refuses it).
    usage = (
        bool(document.get("stream"))
        and not asks_for_usage(document)
        and (options is None or isinstance(options, dict))
    )
    per_replica = bool(model.served_names)
    if (
        per_replica
        or model.served_name != model.public_id
        or (bound is not None and bound[0] in document)
        or (usage and "stream_options" in document)
    ):
        if bound is not None:
            document[bound[0]] = bound[1]
        if usage:
            document["stream_options"] = {**(options or {}), "include_usage": True}
        if per_replica:
            return body, usage, True
        document["model"] = model.served_name
        return orjson.dumps(document), usage, False
    if bound is not None:
        body = with_member(body, b'"%s":%d' % (bound[0].encode(), bound[1]))
    if usage:
        body = with_usage_requested(body, document) or body
    return body, usage, False


def _redacted_body(call: Call, document: dict[str, Any]) -> bytes:
    """The body again after request guardrails rewrote texts in ``document``, with what
    ``_upstream_body`` added (the served name, the completion bound, the usage request)."""
    bound = max_tokens_override(call.path, document, call.model.max_tokens)
    if bound is not None:
        document[bound[0]] = bound[1]
    if call.strip_usage:
        options = document.get("stream_options")
        document["stream_options"] = {**(options or {}), "include_usage": True}
    document["model"] = call.model.served_name
    return orjson.dumps(document)


def _prefix_text(document: dict[str, Any] | None) -> str:
    """The start of the prompt that requests of one use case tend to share (the system prompt,
    a RAG document): what prefix-cache affinity keys on."""
    if document is None:
        return ""
    messages = document.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], dict):
        content = messages[0].get("content")
        return content if isinstance(content, str) else ""
    prompt = document.get("prompt")
    return prompt if isinstance(prompt, str) else ""


def admission_unavailable(exc: BaseException) -> GatewayError:
    # Without Valkey neither limits nor capacity can be enforced; sending the request on
    # anyway could swamp the fleet, so the gateway refuses until Valkey answers again.
    logger.warning("admission_unavailable error=%s", exc.__class__.__name__)
    return errors.service_unavailable(
        "Admission is unavailable (the gateway cannot reach Valkey); retry shortly.",
        code="admission_unavailable",
    )


def refusal(status: int, kind: str, refused: SchedulingRefused, code: str = "") -> GatewayError:
    headers = [(b"retry-after", str(refused.retry_after_s).encode())]
    if isinstance(refused, RateLimited) and refused.never_fits:
        # Larger than the limit itself: no wait helps, so no Retry-After (SDKs would retry
        # forever), and the OpenAI SDKs' own header telling them not to retry.
        headers = [(b"x-should-retry", b"false")]
    return GatewayError(status, str(refused), type=kind, code=code or refused.code, headers=headers)


def _internal_error() -> GatewayError:
    return GatewayError(500, "Internal gateway error.", type="api_error", code="internal_error")


class _AbortResponse(Exception):
    """The response had started; end it by dropping the connection so the client sees a cut."""


async def _interrupt_on_disconnect(receive: Receive, call: Call) -> None:
    """Interrupt the request when its client disconnects before the response is out."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            # A server also reports "disconnect" once the whole response is out: ignored then.
            call.interrupt("client")
            return


def create_app(settings: GatewaySettings | None = None) -> Gateway:
    return Gateway(settings or GatewaySettings.from_env())
