"""A developer's self service: request a use case, follow its status, try it in the playground.

The playground calls the real gateway as the use case — its models, limits, guardrails and
priority — with the use case's playground key (governance/job_keys.py), derived here and never
stored: the web process does not hold any developer's key. The gateway's answer is relayed to
the page as a small event stream (``delta``, ``refusal``, ``error``, ``done``), so a 429 with its
Retry-After or a guardrail's 400 is shown as the developer's code would receive it.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from governance.audit import Actor, audit_record
from governance.choices import UseCaseStatus
from governance.errors import GovernanceError
from governance.job_keys import playground_key, playground_period
from governance.models import AuditEvent, Tenant, UseCase
from governance.roles import Role, can_govern, has_role
from governance.services.use_cases import use_case_create, use_case_transition
from portal import selectors
from portal.developer.forms import PlaygroundForm, UseCaseRequestForm


def _requestable_tenants(request: HttpRequest) -> list[Tenant]:
    """Developers request use cases for the tenants they belong to; officers for any."""
    user = request.user
    if can_govern(user):
        return list(Tenant.objects.order_by("slug"))
    if has_role(user, Role.DEVELOPER):
        return list(Tenant.objects.filter(members=user).order_by("slug"))  # type: ignore[misc]
    return []


def _form_errors(form: UseCaseRequestForm, exc: ValidationError) -> None:
    """The service's complaints, next to the fields they name (the rest above the form)."""
    if not hasattr(exc, "error_dict"):
        form.add_error(None, exc.messages)
        return
    for field, errors in exc.message_dict.items():
        form.add_error(field if field in form.fields else None, errors)


@login_required
def use_case_request(request: HttpRequest) -> HttpResponse:
    """A new use case, submitted for an officer's review (who chooses its models and limits)."""
    tenants = _requestable_tenants(request)
    if not tenants:
        return render(
            request,
            "portal/refused.html",
            {
                "message": "Only a developer of a tenant (or an officer) may request a use case.",
                "back": reverse("portal:dashboard"),
            },
            status=403,
        )
    form = UseCaseRequestForm(
        request.POST or None, tenants=Tenant.objects.filter(pk__in=[t.pk for t in tenants])
    )
    if request.method == "POST" and form.is_valid():
        actor = Actor.from_request(request)
        try:
            with transaction.atomic():
                use_case = use_case_create(
                    actor=actor, tenant=form.cleaned_data["tenant"], fields=form.use_case_fields()
                )
                use_case_transition(actor=actor, use_case=use_case, transition="submit")
        except ValidationError as exc:
            _form_errors(form, exc)
        except (PermissionDenied, GovernanceError) as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request,
                f"Use case {use_case} requested. A governance officer reviews it; "
                "its status below changes when they decide.",
            )
            return redirect(reverse("portal:use_case_detail", args=[use_case.pk]))
    return render(request, "portal/developer/use_case_request.html", {"form": form})


STATUS_ACTIONS = {
    "usecase.create": "Drafted",
    "usecase.submit": "Requested",
    "usecase.approve": "Approved",
    "usecase.reject": "Sent back to draft",
    "usecase.suspend": "Suspended",
    "usecase.reinstate": "Reinstated",
    "usecase.retire": "Retired",
}


@login_required
def use_case_status(request: HttpRequest, pk: int) -> HttpResponse:
    """The use case's status and its history, from the audit trail (polled by the page)."""
    use_case = get_object_or_404(selectors.use_cases_visible(request.user), pk=pk)
    events = AuditEvent.objects.filter(
        object_type=UseCase._meta.label_lower,
        object_id=str(use_case.pk),
        action__in=list(STATUS_ACTIONS),
    ).order_by("sequence")
    history = [
        {
            "label": STATUS_ACTIONS[e.action],
            "at": e.occurred_at,
            "by": e.actor,
            "reason": (e.after or {}).get("reason", "") if isinstance(e.after, dict) else "",
        }
        for e in events
    ]
    final = use_case.status in (UseCaseStatus.APPROVED, UseCaseStatus.RETIRED)
    return render(
        request,
        "portal/developer/_status_history.html",
        {"use_case": use_case, "history": history, "final": final},
    )


# --- the playground --------------------------------------------------------------------------
@dataclass(frozen=True)
class PlaygroundCall:
    use_case_id: int
    body: dict[str, object]


def _playground_call(request: HttpRequest, pk: int) -> PlaygroundCall | HttpResponse:
    """Who may try this use case, with what: refusals as responses, else the call to make."""
    user = request.user
    if not user.is_authenticated:
        return HttpResponse("Sign in first.", status=401, content_type="text/plain")
    use_case = selectors.use_cases_visible(user).filter(pk=pk).first()
    if use_case is None:
        raise Http404("No such use case.")
    member = has_role(user, Role.DEVELOPER) and use_case.tenant.members.filter(pk=user.pk).exists()
    if not (member or can_govern(user)):
        return HttpResponse(
            "Only the use case's developers and governance officers may use its playground.",
            status=403,
            content_type="text/plain",
        )
    if use_case.status != UseCaseStatus.APPROVED:
        return HttpResponse(
            f"The use case is {use_case.get_status_display().lower()}: the gateway serves "
            "approved use cases only.",
            status=409,
            content_type="text/plain",
        )
    models = sorted(m.public_id for m in use_case.allowed_models.all())
    form = PlaygroundForm(request.POST, models=models)
    if not form.is_valid():
        problems = "; ".join(
            f"{name}: {' '.join(str(e) for e in errors)}" for name, errors in form.errors.items()
        )
        return HttpResponse(problems, status=400, content_type="text/plain")
    data = form.cleaned_data
    # Audited like every other use of a use case from the portal: who, which model; never
    # the text (the gateway's records keep that, under the use case's own record policy).
    audit_record(
        actor=Actor.from_request(request),
        action="playground.chat",
        obj=use_case,
        after={"model": data["model"], "max_tokens": data["max_tokens"]},
        tenant_slug=use_case.tenant.slug,
    )
    return PlaygroundCall(
        use_case_id=use_case.pk,
        body={
            "model": data["model"],
            "messages": [{"role": "user", "content": data["message"]}],
            "max_tokens": data["max_tokens"],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )


def _event(name: str, data: dict[str, object]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def _refusal(response: httpx.Response, raw: bytes) -> dict[str, object]:
    """What the gateway refused and why, as the page shows it."""
    try:
        error = json.loads(raw).get("error") or {}
    except (ValueError, AttributeError):
        error = {}
    return {
        "status": response.status_code,
        "code": error.get("code") or "",
        "type": error.get("type") or "",
        "message": error.get("message") or raw.decode(errors="replace")[:500],
        "retry_after": response.headers.get("retry-after"),
        "request_id": response.headers.get("x-request-id", ""),
    }


async def _relay(call: PlaygroundCall) -> AsyncIterator[bytes]:
    url = settings.PLAYGROUND_GATEWAY_URL.rstrip("/") + "/v1/chat/completions"
    key = playground_key(call.use_case_id, playground_period(time.time()))
    headers = {"Authorization": f"Bearer {key}"}
    timeout = httpx.Timeout(settings.PLAYGROUND_TIMEOUT_SECONDS, connect=5.0)
    # A client per call: the playground is a person typing, not the hot path, and a client
    # shared across requests would be bound to one event loop (WSGI servers run a new one each).
    try:
        async with (
            httpx.AsyncClient(timeout=timeout) as client,
            client.stream("POST", url, json=call.body, headers=headers) as response,
        ):
            request_id = response.headers.get("x-request-id", "")
            if response.status_code != 200:
                yield _event("refusal", _refusal(response, await response.aread()))
                return
            yield _event("start", {"request_id": request_id})
            usage: object = None
            finish: object = None
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:  # a guardrail that stopped the answer mid-stream
                    error = chunk["error"] or {}
                    yield _event(
                        "refusal",
                        {
                            "status": 200,
                            "code": error.get("code") or "",
                            "type": error.get("type") or "",
                            "message": error.get("message") or "The answer was stopped.",
                            "retry_after": None,
                            "request_id": request_id,
                        },
                    )
                    return
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        yield _event("delta", {"text": text})
                    finish = choice.get("finish_reason") or finish
            yield _event("done", {"request_id": request_id, "usage": usage, "finish": finish})
    except httpx.HTTPError as exc:
        yield _event(
            "error", {"message": f"The gateway could not be reached ({type(exc).__name__})."}
        )


async def playground_chat(request: HttpRequest, pk: int) -> HttpResponse | StreamingHttpResponse:
    if request.method != "POST":
        return HttpResponse("POST a message.", status=405, headers={"Allow": "POST"})
    checked = await sync_to_async(_playground_call)(request, pk)
    if isinstance(checked, HttpResponse):
        return checked
    response = StreamingHttpResponse(_relay(checked), content_type="text/event-stream")
    response["Cache-Control"] = "no-store"
    response["X-Accel-Buffering"] = "no"  # a proxy in front must not hold the stream back
    return response
