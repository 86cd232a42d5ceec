"""The front door: the steps every door into inference passes before its request is
admitted, written once (issue 24). A door that skipped one would be a way around a use
case's governance; a new door calls these and cannot forget a control.

In order: the request id; the caller (an API key, or a Keycloak service-account token) and
with it the use case's status (a suspended or retired use case's keys and clients are not in
the snapshot, so they fail here, on every request); the body, parsed and validated; the model,
resolved and checked against the use case's approved models and the endpoint's capability;
the token estimate and the model's cap on the completion; the ticket's plan (rate limits,
rank, fair-share cost, prefix affinity); and the use case's request guardrails, after its
rate limits are judged.

Plain functions over ``FrontDoor``, the services they need, made once per process by the
gateway (gateway/app.py) and handed to the async door (gateway/async_tasks/api.py). The
synchronous path is the hot one: nothing here allocates or does I/O that the path did not
before, and every refusal is the same GatewayError it always was.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import valkey.asyncio as avalkey

from gateway import errors, model_routing
from gateway.accounting import Accounting
from gateway.call import Call
from gateway.costs import (
    Estimate,
    estimate_json_request,
    estimate_transcription,
    max_tokens_override,
)
from gateway.errors import GatewayError
from gateway.guardrail_plan import GuardPlan
from gateway.guardrails.run import Body, Guardrails, StageResult, blocked_message, request_slots
from gateway.metrics import Decision, GatewayMetrics
from gateway.model_lifecycle import serving_model
from gateway.policy import Model, Policy, Principal
from gateway.policy_store import PolicyStore
from gateway.scheduling import (
    RateLimited,
    Scheduler,
    SchedulingRefused,
    TicketPlans,
    prefix_hash,
)
from gateway.service_accounts import KeysUnavailable, TokenRefused, TokenVerifier
from gateway.settings import GatewaySettings
from gateway.usage import asks_for_usage, with_usage_requested
from guardrails.texts import Slot
from runtime.http import Receive, Scope, header, read_body, with_member
from runtime.multipart import Form, FormError, encode_form, is_multipart, parse_form
from runtime.valkey_urls import VALKEY_FAILURES

logger = logging.getLogger("gateway")

_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._-]{1,128}$")

# The counts the model's cap and the token estimate read: integers or null, nothing else.
_INTEGER_PARAMETERS = ("max_tokens", "max_completion_tokens", "n", "best_of")

# What judging a request's rate limits may end in, besides passing.
_JUDGING_FAILURES: tuple[type[BaseException], ...] = (RateLimited, *VALKEY_FAILURES)

# Which capability each forwarding endpoint needs from the model.
CAPABILITY = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/audio/transcriptions": "transcription",
}


@dataclass(frozen=True, slots=True)
class FrontDoor:
    """What the front door's steps need, one per gateway process, shared by every door."""

    settings: GatewaySettings
    metrics: GatewayMetrics
    scheduler: Scheduler
    valkey: avalkey.Valkey
    policy: PolicyStore
    tokens: TokenVerifier | None  # Keycloak service-account tokens, when a realm is set
    guardrails: Guardrails
    plans: TicketPlans
    accounting: Accounting


def request_id_of(scope: Scope) -> bytes:
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
    if model is None and "@" in name:  # a version or an alias: model@v2, model@stable
        model = model_routing.named(policy, name)
    if model is None:
        raise errors.not_found(
            f"The model '{name}' does not exist or you do not have access to it.",
            code="model_not_found",
        )
    if model.base not in principal.models:
        raise GatewayError(
            403,
            f"Use case '{principal.use_case}' is not approved for model '{name}'.",
            type="permission_error",
            code="model_not_allowed",
            param="model",
        )
    if model.lifecycle is not None:  # the one check an active model pays
        model = serving_model(policy, model, name)
    if model.routing is not None:  # a model with versions: which one serves
        model = model_routing.route(policy, model, principal.use_case_id)
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


async def read_call(
    door: FrontDoor,
    scope: Scope,
    receive: Receive,
    policy: Policy,
    principal: Principal,
    request_id: bytes,
) -> Call:
    """A forwarding request read, validated and resolved: its body within the door's bound,
    its model, its estimate and the body replicas get (less the priority)."""
    path: str = scope["path"]
    document: dict[str, Any] | None = None
    form: Form | None = None
    strip_usage = per_replica = False
    if path == "/v1/audio/transcriptions":
        model, form, body, content_type, estimate = await _read_upload(
            door, scope, receive, policy, principal
        )
        per_replica = bool(model.served_names)
    else:
        body = await read_body(receive, door.settings.max_body_bytes)
        document = parse_json_object(body)
        validate_request(path, document)
        model = resolve_model(policy, principal, document.get("model"), CAPABILITY[path])
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
    door: FrontDoor, scope: Scope, receive: Receive, policy: Policy, principal: Principal
) -> tuple[Model, Form, bytes, bytes, Estimate]:
    """A transcription upload: a bounded multipart body with ``model`` and ``file``."""
    content_type = header(scope, b"content-type")
    if content_type is None or not is_multipart(content_type):
        raise errors.bad_request(
            "Send the audio as multipart/form-data with 'file' and 'model' fields."
        )
    body = await read_body(receive, door.settings.max_upload_bytes)
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


def plan_ticket(door: FrontDoor, call: Call, policy: Policy) -> None:
    """What acquire needs: the rate limits with this request's token estimate, and the
    queue's view of it (rank, fair-share cost, prefix affinity). No I/O."""
    call.ticket = door.plans.plan(policy, call.principal, call.model).ticket(
        request_id=call.request_id,
        # Fair sharing weighs requests by tokens whether or not a token limit applies.
        cost=call.estimate.total,
        prefix_hash=prefix_hash(_prefix_text(call.document)),
        prompt_tokens=call.estimate.prompt,
    )


async def check_request(door: FrontDoor, call: Call, guard: GuardPlan, policy: Policy) -> None:
    """Request guardrails, after the rate limits (judged, not counted: acquire counts
    them) and before the request takes a replica's capacity. Blocks (400), rewrites
    the body (redact), or lets it through (flag); 503 when a check cannot run and the use
    case fails closed. What the checks cannot read as text is refused first (400)."""
    slots = readable_slots(call)
    assert call.ticket is not None
    try:
        await door.scheduler.check_limits(call.ticket)
    except _JUDGING_FAILURES as exc:
        raise limits_refusal(door, call, exc) from None
    if not slots:
        return
    texts = [container[key] for container, key, _ in slots]
    if (over := over_budget(door, guard, texts)) is not None:
        raise over
    assert guard.request is not None
    result = await door.guardrails.run(
        guard.request, texts, call.document, [role for _, _, role in slots]
    )
    apply_checked(door, call, guard, policy, slots, texts, result)


class BodyRefused(Exception):
    """One of many bodies checked together was refused: which one (from 0), and how."""

    def __init__(self, index: int, error: GatewayError) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


async def check_requests(
    door: FrontDoor, calls: Sequence[Call], guard: GuardPlan, policy: Policy
) -> None:
    """``check_request`` for the bodies of one call (an async bulk submit), with the same
    outcome body by body in order, but the guardrails run once for all of them: one batch to
    the guardrail service, so its workers share the bodies out, and the fleet's checks
    concurrently. ``BodyRefused`` names the first body refused, as checking them in turn
    would have: the steps before the guardrails (readable, rate limits judged, text budget)
    stop at the first body they refuse, and only the bodies before it are checked; findings
    are recorded body by body up to the first refused one."""
    assert guard.request is not None
    slots: list[list[Slot]] = []
    refused: BodyRefused | None = None
    for index, call in enumerate(calls):
        try:
            slots.append(readable_slots(call))
        except GatewayError as exc:
            refused = BodyRefused(index, exc)
            break
    judged = await asyncio.gather(
        *(_judge_limits(door, call) for call in calls[: len(slots)]), return_exceptions=True
    )
    texts: list[list[str]] = []
    for index, outcome in enumerate(judged):
        if isinstance(outcome, _JUDGING_FAILURES):
            refused = BodyRefused(index, limits_refusal(door, calls[index], outcome))
            break
        if isinstance(outcome, BaseException):
            raise outcome
        found = [container[key] for container, key, _ in slots[index]]
        if found and (over := over_budget(door, guard, found)) is not None:
            refused = BodyRefused(index, over)
            break
        texts.append(found)
    # Only the bodies before the first refused one, as in turn; those with texts to check.
    checked = [index for index in range(len(texts)) if slots[index]]
    results = await door.guardrails.run_many(
        guard.request,
        [Body(texts[i], calls[i].document, [role for _, _, role in slots[i]]) for i in checked],
    )
    for index, result in zip(checked, results, strict=True):
        try:
            apply_checked(door, calls[index], guard, policy, slots[index], texts[index], result)
        except GatewayError as exc:
            raise BodyRefused(index, exc) from None
    if refused is not None:
        raise refused


async def _judge_limits(door: FrontDoor, call: Call) -> None:
    assert call.ticket is not None
    await door.scheduler.check_limits(call.ticket)


def readable_slots(call: Call) -> list[Slot]:
    """Where the request's texts are (a JSON body, or an upload's form fields: a
    transcription's prompt); 400 for what the checks cannot read as text."""
    fields = call.form.fields if call.form is not None else None
    readable = call.document if call.document is not None else fields
    assert readable is not None
    return request_slots(call.path, readable)


def limits_refusal(door: FrontDoor, call: Call, exc: BaseException) -> GatewayError:
    """What a request gets when its rate limits, judged before its guardrails, refuse it
    (recorded as a decision) or cannot be judged."""
    if isinstance(exc, RateLimited):
        decided(door, call, "rejected", f"rate_limit:{exc.limit.name}", exc.retry_after_s)
        return refusal(429, "rate_limit_error", exc, code="rate_limit_exceeded")
    return admission_unavailable(exc)


def over_budget(door: FrontDoor, guard: GuardPlan, texts: list[str]) -> GatewayError | None:
    """The 400 for texts over the guardrail service's budget, when the service checks them."""
    checks = guard.request
    assert checks is not None
    if checks.service or checks.scoped:
        return door.guardrails.service.over_budget(texts)
    return None


def apply_checked(
    door: FrontDoor,
    call: Call,
    guard: GuardPlan,
    policy: Policy,
    slots: list[Slot],
    texts: list[str],
    result: StageResult,
) -> None:
    """What the request guardrails found, applied: recorded, the body rewritten (redact),
    refused (block: 400; a check that could not run when the use case fails closed: 503)."""
    door.guardrails.record(
        call,
        stage="request",
        findings=result.findings,
        failed=result.failed,
        failure=guard.failure,
        policy_version=policy.version,
    )
    document = call.document
    if result.texts != texts:
        # Also when blocked: a full record keeps the refused request as redacted.
        for (container, key, _), text in zip(slots, result.texts, strict=True):
            container[key] = text
        if call.rename_per_replica:
            pass  # the body is made at the grant
        elif document is not None:
            call.body = rebuilt_body(call, document)
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
        raise door.guardrails.unavailable("request", result.failed)


def decided(
    door: FrontDoor, call: Call, decision: Decision, reason: str, retry_after_s: int = 0
) -> None:
    """An admission decision about ``call``: counted, and written to the decisions stream."""
    # The metric's label stays bounded ("rate_limit"); the stream keeps the limit's name.
    door.metrics.admission_decided(decision, reason.split(":", 1)[0])
    door.accounting.record_decision(
        request_id=call.request_id,
        decision=decision,
        reason=reason,
        tenant=call.principal.tenant,
        use_case_id=call.principal.use_case_id,
        key_id=call.principal.key_id,
        model=call.model.public_id,
        wait_ms=call.grant.queued_ms if call.grant else 0,
        policy_version=door.policy.version,
        record_id=call.record_id,
        retry_after_s=retry_after_s,
    )


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


def rebuilt_body(call: Call, document: dict[str, Any]) -> bytes:
    """The body again from ``document`` for ``call.model`` (after request guardrails
    rewrote texts in it, or for a fallback model), with what ``_upstream_body`` adds (the
    served name, the completion bound, the usage request)."""
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
