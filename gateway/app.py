"""The gateway: a lean, pure-ASGI, OpenAI-compatible front door to the vLLM fleet.

Per request it does only in-memory work (the front door's steps, gateway/front_door.py, which
every door passes: authenticate against the policy snapshot, validate the body, plan, request
guardrails) before forwarding over a pooled connection; the database is never touched and the
only I/O is the upstream call itself. This module keeps the routing, the lifespan, admission's
outcome, the relay and the accounting. Streams are relayed chunk by chunk and the upstream is
always closed — on completion, on error and when the client goes away.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson

from gateway import control_proxy, errors, fallbacks, openapi
from gateway.accounting import Accounting, Usage
from gateway.admission import estimated_tokens, reconcile_args
from gateway.async_tasks import layout as async_layout
from gateway.async_tasks.api import AsyncTaskDoor
from gateway.autopipeline import Arg, auto_pipeline
from gateway.call import Call
from gateway.errors import GatewayError
from gateway.front_door import (
    FrontDoor,
    admission_unavailable,
    authenticate,
    authenticate_after_key_fetch,
    check_request,
    decided,
    plan_ticket,
    read_call,
    refusal,
    request_id_of,
)
from gateway.guardrail_plan import GuardPlan
from gateway.guardrails.fleet import ask_logprobs
from gateway.guardrails.run import Guardrails
from gateway.guardrails.stream import GuardedStream
from gateway.logcontext import REQUEST_ID
from gateway.metrics import Decision, GatewayMetrics
from gateway.policy import DEFAULT_RECORD_POLICY, Model, Policy
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
    Ticket,
    TicketPlans,
    saturated_entry,
    write_fleet,
)
from gateway.service_accounts import TokenVerifier
from gateway.settings import GatewaySettings
from gateway.upstream import ReplicaUnreachable, Upstream, UpstreamError
from gateway.usage import UsageEventFilter, UsageMeter
from runtime.http import (
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    header,
    send_response,
    with_member,
)
from runtime.multipart import encode_form
from runtime.valkey_urls import VALKEY_FAILURES, async_client, is_cluster

logger = logging.getLogger("gateway")


class Gateway:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.valkey = async_client(settings.fleet.valkey_url)
        self.policy = PolicyStore(
            self.valkey,
            refresh_s=settings.fleet.policy_refresh_s,
            max_staleness_s=settings.fleet.policy_max_staleness_s,
        )
        self.upstream = Upstream(
            connect_timeout_s=settings.fleet.upstream_connect_timeout_s,
            max_connections=settings.upstream_max_connections,
        )
        self.metrics = GatewayMetrics()
        self.scheduler = Scheduler(
            self.valkey,
            pipe=auto_pipeline(self.valkey),  # one server, Sentinel or Cluster
            lease_ms=settings.fleet.lease_ms,
            heartbeat_ms=settings.fleet.heartbeat_ms,
            stale_ms=settings.fleet.stale_ms,
            waiting_threshold=settings.fleet.backpressure_waiting,
            long_prompt_tokens=settings.fleet.long_prompt_tokens,
            # A Valkey Cluster: each slot charged by its own script (docs/gateway-scheduling.md)
            split_slots=is_cluster(settings.fleet.valkey_url),
        )
        # One connection for the hot path's scripts and the accounting streams.
        self.accounting = Accounting(
            self.valkey,
            metrics=self.metrics,
            # WAIT blocks its connection: the writer gets its own when it waits for replicas.
            pipe=None if settings.usage_replicas else self.scheduler.pipe,
            content_budget_bytes=settings.records.buffer_bytes,
            replicas=settings.usage_replicas,
            replica_timeout_ms=settings.usage_replica_timeout_ms,
        )
        self.guardrails = Guardrails.connect(
            settings.guardrails,
            upstream=self.upstream,
            policy=self.policy,
            scheduler=self.scheduler,
            metrics=self.metrics,
            accounting=self.accounting,
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
        # What every door's first steps need (gateway/front_door.py): this path's and the
        # async task API's (gateway/async_tasks/).
        self.door = FrontDoor(
            settings=settings,
            metrics=self.metrics,
            scheduler=self.scheduler,
            valkey=self.valkey,
            policy=self.policy,
            tokens=self.tokens,
            guardrails=self.guardrails,
            plans=TicketPlans(),
            accounting=self.accounting,
        )
        self.async_tasks = AsyncTaskDoor(self.door)
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
            await asyncio.wait(self._background, timeout=self.settings.fleet.policy_refresh_s + 2)
        if self.tokens is not None:
            await self.tokens.close()
        await self.async_tasks.close()
        await self.accounting.close()
        await self.scheduler.close()
        await self.upstream.close()
        await self.control.close()
        await self.valkey.aclose()

    async def handle_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = request_id_of(scope)
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
        now = time.time()
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "switchyard"}
            for name in sorted(_callable_names(policy, principal.models))
            if not _refused_now(policy.models[name.partition("@")[0]], now)
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
        call = await read_call(self.door, scope, receive, policy, principal, request_id)
        if policy.fallbacks:  # the one check a fleet without fallback chains pays
            call.fallbacks = fallbacks.chain_for(policy, call)
        # The one lookup a use case without full records pays.
        call.record = policy.records.get(principal.use_case_id, DEFAULT_RECORD_POLICY)
        if call.record == "full":
            # What the client receives, errors included, is what the transcript keeps.
            send = call.recorder = Recorder(send, self.settings.records.max_content_bytes)
            if call.form is not None:
                # Hashed in a thread, beside the upstream call: an upload is up to 25 MiB.
                loop = asyncio.get_running_loop()
                call.digests = loop.run_in_executor(None, file_digests, call.form)
        try:
            plan_ticket(self.door, call, policy)
            # The one lookup a use case without guardrails pays.
            guard = policy.guarded.get(principal.use_case_id)
            if guard is not None:
                call.guard = guard
                if guard.request is not None:
                    await check_request(self.door, call, guard, policy)
            # One watcher per request: a client that goes away cancels this task, which
            # leaves the queue or closes the upstream (vLLM then aborts and frees its slot).
            handler = asyncio.current_task()
            assert handler is not None
            call.handler = handler
            watcher = asyncio.ensure_future(_interrupt_on_disconnect(receive, call))
            try:
                await self._serve_or_fall_back(call, send, policy)
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
            *call.model.notices,
            *exc.headers,
        ]
        await send_response(send, exc.status, exc.body(), headers=headers)

    async def _serve_or_fall_back(self, call: Call, send: Send, policy: Policy) -> None:
        """``_serve``; where the model refuses for capacity before any byte is out and the
        use case has a fallback for it, the fallback serves (gateway/fallbacks.py)."""
        while True:
            try:
                await self._serve(call, send, policy)
                return
            except fallbacks.FallBack as refused:
                if not fallbacks.fall_back(self.door, call, policy, refused):
                    if refused.decision is not None:  # recorded as it is without fallbacks
                        decided(self.door, call, refused.decision[0], refused.reason,
                                refused.decision[1])  # fmt: skip
                    raise refused.error from None

    async def _serve(self, call: Call, send: Send, policy: Policy) -> None:
        """Acquire capacity (rate limits included), relay from the granted replica; fail over
        if it is unreachable."""
        ticket = call.ticket
        assert ticket is not None
        if call.fallbacks:
            ticket = fallbacks.waiting_ticket(policy, call, ticket)
        for _ in range(max(len(call.model.replicas), 1)):
            grant = await self._acquire(call, ticket)
            try:
                async with self.scheduler.keep_alive(
                    grant,
                    lambda: self._reconciliation(call),
                    wait_for_release=False,
                    # A replica that never took it, or a refusal a fallback answers instead:
                    # this attempt is not charged.
                    refund_on=(ReplicaUnreachable, fallbacks.FallBack),
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
            decided(
                self.door,
                call,
                "rejected",
                f"rate_limit:{refused.limit.name}",
                refused.retry_after_s,
            )
            raise refusal(429, "rate_limit_error", refused, code="rate_limit_exceeded") from None
        except MaxConcurrent as refused:
            decided(self.door, call, "rejected", refused.code, refused.retry_after_s)
            raise refusal(429, "rate_limit_error", refused) from None
        except (QueueFull, QueueTimeout) as refused:
            decision: Decision = "rejected" if isinstance(refused, QueueFull) else "shed"
            error = refusal(503, "service_unavailable", refused)
            if call.fallbacks:  # recorded by whoever learns that no fallback takes it
                raise fallbacks.FallBack(
                    refused.code, error, (decision, refused.retry_after_s)
                ) from None
            decided(self.door, call, decision, refused.code, refused.retry_after_s)
            raise error from None
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
            if call.guard is not None and call.guard.logprobs:
                body = ask_logprobs(call.path, body, call.document)
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
            if call.fallbacks and (response.status >= 500 or response.status == 400):
                await self._refused_upstream(call, response)
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
                if model.notices:  # a deprecated model, or a successor serving its id
                    response_headers += model.notices
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

    async def _refused_upstream(self, call: Call, response: Any) -> None:
        """With a fallback left, a replica's 5xx, or its 400 for a prompt longer than the
        model's context, is not sent: FallBack, before any byte is out. Another 400 is read
        (it is small) and relayed as it came."""
        if response.status >= 500:
            response.close()
            error = GatewayError(
                502,
                f"The replica serving '{call.model.public_id}' answered {response.status}.",
                type="api_error",
                code="upstream_error",
            )
            raise fallbacks.FallBack("upstream_error", error)
        too_long = fallbacks.context_too_long(await response.peek(fallbacks.MAX_ERROR_BYTES))
        if too_long is not None:
            response.close()
            raise fallbacks.FallBack("context_length", too_long)

    async def _relay_checked(
        self, call: Call, guard: GuardPlan, response: Any, meter: UsageMeter, send: Send
    ) -> None:
        """A 200 answer under response guardrails: read whole and checked (then sent as it
        is, redacted, or refused with 422), or, streamed, windowed
        (gateway/guardrails/stream.py)."""
        checks = guard.response
        assert checks is not None
        headers = [
            (b"content-type", response.content_type),
            (b"x-request-id", call.request_id_bytes),
            (b"x-switchyard-record-id", call.record_id_bytes),
            *call.model.notices,
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
            logprobs=guard.logprobs,
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
            decided(self.door, call, "queued", call.ticket.priority_class if call.ticket else "")
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


def _callable_names(policy: Policy, granted: frozenset[str]) -> list[str]:
    """The granted models the snapshot serves, and for a model with versions each version
    and alias a client may pin itself to (``model@v2``, ``model@stable``)."""
    names = []
    for name in granted:
        model = policy.models.get(name)
        if model is None:
            continue
        names.append(name)
        if model.routing is not None:
            names += [
                f"{name}@{label}" for label in (*model.routing.versions, *model.routing.aliases)
            ]
    return names


def _refused_now(model: Model, now: float) -> bool:
    """Past its sunset with no successor to serve it: a 410, so not listed as callable."""
    lifecycle = model.lifecycle
    return lifecycle is not None and lifecycle.ended(now) and lifecycle.at_sunset == "refuse"


def with_priority(body: bytes, priority: int) -> bytes:
    """The JSON object ``body`` with ``"priority": priority`` added as its last member.

    ``body`` is a validated JSON object without ``priority`` (validate_request)."""
    return with_member(body, b'"priority":%d' % priority)


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
