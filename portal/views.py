"""The portal's pages. Each view parses a form, calls one service, and redirects.

Reads go through ``portal.selectors`` (scoped to the person's tenants: a row outside that
scope is a 404, never a 403, so its existence does not leak). Writes go through
``governance.services``, which authorise, validate, audit and republish the gateway's policy;
their refusals become words for the person in one place, ``_refusal``.

A key's secret is on exactly one response, the one that reveals it (or rotates it), and that
response is marked ``no-store``: no other page, message or log line ever holds it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from typing import Concatenate, ParamSpec

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.timesince import timeuntil
from django.utils.timezone import now
from django.views.decorators.http import require_POST

from governance.audit import Actor
from governance.errors import GovernanceError
from governance.models import ApiKey, UseCase
from governance.roles import Role, can_govern, can_read_everything, has_role, roles_of
from governance.services.api_keys import (
    api_key_decide,
    api_key_request,
    api_key_reveal,
    api_key_revoke,
    api_key_rotate,
)
from governance.services.record_policy import (
    tenant_set_legal_hold,
    use_case_set_legal_hold,
    use_case_set_records,
)
from governance.services.use_cases import use_case_transition
from portal import selectors
from portal.developer.snippets import quickstart
from portal.forms import (
    DecisionSearchForm,
    FindingSearchForm,
    KeyDecisionForm,
    KeyRequestForm,
    LegalHoldForm,
    ReasonForm,
    RecordSettingsForm,
    UseCaseTransitionForm,
)
from portal.officer.queue import attach_histories

P = ParamSpec("P")
# Rows per list on the dashboard (use cases, keys): the page stays quick for a whole company.
DASHBOARD_ROWS_PER_PAGE = 25
View = Callable[Concatenate[HttpRequest, P], HttpResponse]


# --- the one place where the domain's refusals become words -------------------------------
def _refusal(request: HttpRequest, exc: Exception, back: str) -> HttpResponse:
    """A missing right is a 403 page; a bad value or a state conflict, a message and a way back."""
    if isinstance(exc, PermissionDenied):
        text = str(exc) or "You may not do this."
        return render(request, "portal/refused.html", {"message": text, "back": back}, status=403)
    if isinstance(exc, ValidationError):
        messages.error(request, " ".join(exc.messages))
    else:
        messages.error(request, str(exc))
    return redirect(back)


def _back(request: HttpRequest, fallback: str) -> str:
    """Where to go after an action: the page that posted it (``next``), if it is ours."""
    wanted = request.POST.get("next", "")
    if wanted and url_has_allowed_host_and_scheme(
        wanted, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return wanted
    return fallback


def portal_action(back: Callable[..., str]) -> Callable[[View[P]], View[P]]:
    """Wrap a view that changes something: signed in, not read-only, refusals mapped.

    ``back(**url_kwargs)`` is where a refused action returns to, unless the form said ``next``.
    """

    def decorate(view: View[P]) -> View[P]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: P.args, **kwargs: P.kwargs) -> HttpResponse:
            fallback = back(**kwargs)
            if not selectors.can_act(request.user):
                return _refusal(
                    request,
                    PermissionDenied("Your account has read-only access (or no role yet)."),
                    fallback,
                )
            try:
                return view(request, *args, **kwargs)
            except (PermissionDenied, ValidationError, GovernanceError) as exc:
                return _refusal(request, exc, _back(request, fallback))

        return login_required(wrapper)  # type: ignore[return-value]

    return decorate


def _key_url(pk: int) -> str:
    return reverse("portal:key_detail", args=[pk])


def _use_case_url(pk: int) -> str:
    return reverse("portal:use_case_detail", args=[pk])


def _review_url(**_: object) -> str:
    return reverse("portal:review")


def _key_for(request: HttpRequest, pk: int) -> ApiKey:
    return get_object_or_404(selectors.keys_visible(request.user), pk=pk)


def _use_case_for(request: HttpRequest, pk: int) -> UseCase:
    return get_object_or_404(selectors.use_cases_visible(request.user), pk=pk)


def _actor(request: HttpRequest) -> Actor:
    return Actor.from_request(request)


# --- pages anyone signed in may read (scoped to their tenants) -----------------------------
def home(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "portal/home.html",
        {
            "catalogue": selectors.model_catalogue(),
            "gateway_url": settings.GATEWAY_PUBLIC_URL,
            "can_govern": can_govern(request.user),
        },
    )


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    user = request.user
    # A company has hundreds of use cases and keys: one page of each, each list with its own
    # page number so that paging through keys keeps the use cases where they were; newest first,
    # as the pager (Newer, Older) reads.
    use_cases = Paginator(
        selectors.use_cases_visible(user).order_by("-pk"),
        DASHBOARD_ROWS_PER_PAGE,
    ).get_page(request.GET.get("page"))
    keys = Paginator(
        selectors.keys_visible(user).order_by("-pk"), DASHBOARD_ROWS_PER_PAGE
    ).get_page(request.GET.get("keys_page"))
    return render(
        request,
        "portal/dashboard.html",
        {
            "use_cases": use_cases,
            "keys": keys,
            "read_only": not selectors.can_act(user),
            "is_developer": has_role(user, Role.DEVELOPER),
            "sees_everything": can_read_everything(user),
            "now": now(),
        },
    )


@login_required
def use_case_detail(request: HttpRequest, pk: int) -> HttpResponse:
    use_case = _use_case_for(request, pk)
    return render(
        request,
        "portal/use_case_detail.html",
        {
            "use_case": use_case,
            "keys": selectors.keys_visible(request.user).filter(use_case=use_case),
            "actions": selectors.use_case_actions(request.user, use_case),
            "guardrails": use_case.guardrails.order_by("position", "pk"),
            "finding_counts": selectors.use_case_finding_counts(use_case),
            "governs": can_govern(request.user),
            "records_form": RecordSettingsForm(
                initial={
                    "record_policy": use_case.record_policy,
                    "record_retention_days": use_case.record_retention_days,
                    "records_visible_to_developers": use_case.records_visible_to_developers,
                }
            ),
            "sees_findings": can_read_everything(request.user),
            "model_notices": selectors.model_notices(use_case),
            "now": now(),
        },
    )


@login_required
def key_detail(request: HttpRequest, pk: int) -> HttpResponse:
    key = _key_for(request, pk)
    return render(
        request,
        "portal/key_detail.html",
        {
            "key": key,
            "actions": selectors.key_actions(request.user, key),
            "successor": selectors.key_successor(key),
            "expired": selectors.key_expired(key),
            "quickstart": quickstart(key, settings.GATEWAY_PUBLIC_URL),
        },
    )


@login_required
def review(request: HttpRequest) -> HttpResponse:
    if not can_read_everything(request.user):
        raise Http404("The review queue is for governance officers.")
    queue = selectors.review_queue(request.user)
    # Each request with its context and its history (docs/portal.md "Governance officers").
    attach_histories(queue.pending_keys, queue.submitted_use_cases)
    return render(
        request,
        "portal/review.html",
        {
            "queue": queue,
            "can_decide": can_govern(request.user),
        },
    )


@login_required
def admission_decisions(request: HttpRequest) -> HttpResponse:
    """Refusals and queue waits, newest first: "why was request X refused at 14:02?".

    The same scope as ``/api/admission-decisions/``: officers, auditors and admins see every
    tenant's rows, developers their own tenants'; an account without a role is refused.
    """
    user = request.user
    if not roles_of(user):
        return _refusal(
            request,
            PermissionDenied("Your account has no Switchyard role yet; ask the platform team."),
            reverse("portal:home"),
        )
    use_cases = selectors.use_cases_visible(user).prefetch_related(None)
    form = DecisionSearchForm(request.GET, use_cases=use_cases)
    page = None
    rows: list[selectors.DecisionRow] = []
    if form.is_valid():
        data = form.cleaned_data
        found = selectors.admission_decisions_search(
            user,
            request_id=data["request_id"],
            use_case_id=data["use_case"].pk if data["use_case"] else None,
            decision=data["decision"],
            occurred_from=data["occurred_from"],
            occurred_to=data["occurred_to"],
        )
        page = Paginator(found, selectors.DECISIONS_PER_PAGE).get_page(request.GET.get("page"))
        rows = selectors.decision_rows(user, page.object_list)
    return render(
        request,
        "portal/admission_decisions.html",
        {
            "form": form,
            "page": page,
            "rows": rows,
            "searched": any(form.data.get(name) for name in form.fields),
            "sees_everything": can_read_everything(user),
        },
    )


@login_required
def guardrail_findings(request: HttpRequest) -> HttpResponse:
    """What the guardrails found, newest first, with counts by guardrail and action: for
    officers, auditors and admins (developers read their own through the API)."""
    user = request.user
    if not can_read_everything(user):
        raise Http404("Guardrail findings are for governance officers and auditors.")
    use_cases = selectors.use_cases_visible(user).prefetch_related(None)
    form = FindingSearchForm(request.GET, use_cases=use_cases)
    page = None
    counts: list[dict[str, object]] = []
    if form.is_valid():
        data = form.cleaned_data
        found = selectors.guardrail_findings_search(
            user,
            request_id=data["request_id"],
            use_case_id=data["use_case"].pk if data["use_case"] else None,
            guardrail=data["guardrail"],
            action=data["action"],
            occurred_from=data["occurred_from"],
            occurred_to=data["occurred_to"],
        )
        counts = selectors.finding_counts(found)
        page = Paginator(found, selectors.FINDINGS_PER_PAGE).get_page(request.GET.get("page"))
    names = {uc.pk: uc for uc in use_cases}
    return render(
        request,
        "portal/guardrail_findings.html",
        {
            "form": form,
            "page": page,
            "rows": [(f, names.get(f.use_case_id)) for f in (page.object_list if page else [])],
            "counts": counts,
            "searched": any(form.data.get(name) for name in form.fields),
        },
    )


# --- a developer's key: request, reveal once, rotate, revoke ------------------------------
@portal_action(back=_use_case_url)
def key_request(request: HttpRequest, pk: int) -> HttpResponse:
    use_case = _use_case_for(request, pk)
    form = KeyRequestForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        key = api_key_request(
            actor=_actor(request),
            use_case=use_case,
            name=form.cleaned_data["name"],
            reason=form.cleaned_data["reason"],
            expires_at=form.expires_at,
        )
        messages.success(
            request,
            f"Key “{key.name}” requested. A governance officer will review it; once approved you "
            "can reveal it here, once.",
        )
        return redirect(_key_url(key.pk))
    return render(
        request,
        "portal/key_request.html",
        {
            "use_case": use_case,
            "form": form,
            "actions": selectors.use_case_actions(request.user, use_case),
        },
    )


def _secret_page(
    request: HttpRequest, key: ApiKey, plaintext: str, **extra: object
) -> HttpResponse:
    """The only response that ever carries a key's secret: never stored, never cached."""
    response = render(
        request,
        "portal/key_secret.html",
        {
            "key": key,
            "plaintext": plaintext,
            "quickstart": quickstart(key, settings.GATEWAY_PUBLIC_URL),
            **extra,
        },
    )
    add_never_cache_headers(response)
    response["Referrer-Policy"] = "no-referrer"
    return response


@portal_action(back=_key_url)
@require_POST
def key_reveal(request: HttpRequest, pk: int) -> HttpResponse:
    key, plaintext = api_key_reveal(actor=_actor(request), key=_key_for(request, pk))
    return _secret_page(request, key, plaintext)


@portal_action(back=_key_url)
def key_rotate(request: HttpRequest, pk: int) -> HttpResponse:
    key = _key_for(request, pk)
    if request.method != "POST":
        moment = now()
        grace = timedelta(seconds=settings.API_KEY_ROTATION_GRACE_SECONDS)
        return render(
            request,
            "portal/key_rotate.html",
            {"key": key, "grace": timeuntil(moment + grace, moment)},
        )
    successor, plaintext = api_key_rotate(actor=_actor(request), key=key)
    return _secret_page(request, successor, plaintext, rotated_from=key)


@portal_action(back=_key_url)
def key_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    key = _key_for(request, pk)
    form = ReasonForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        api_key_revoke(actor=_actor(request), key=key, reason=form.cleaned_data["reason"])
        messages.success(
            request, f"Key “{key.name}” ({selectors.key_hint(key)}) is revoked: it no longer works."
        )
        return redirect(_key_url(key.pk))
    return render(request, "portal/key_revoke.html", {"key": key, "form": form})


# --- an officer's decisions -----------------------------------------------------------------
@portal_action(back=_review_url)
@require_POST
def key_decide(request: HttpRequest, pk: int) -> HttpResponse:
    key = _key_for(request, pk)
    form = KeyDecisionForm(request.POST)
    if not form.is_valid():
        raise ValidationError("Choose approve or reject.")
    api_key_decide(
        actor=_actor(request), key=key, approve=form.approve, reason=form.cleaned_data["reason"]
    )
    verdict = "approved" if form.approve else "rejected"
    messages.success(request, f"Key request “{key.name}” for {key.use_case} {verdict}.")
    return redirect(_back(request, _review_url()))


TRANSITION_DONE = {
    "submit": "submitted for review",
    "approve": "approved",
    "reject": "sent back to draft",
    "suspend": "suspended: its keys stop working at the gateway within seconds",
    "reinstate": "reinstated: its keys work again",
    "retire": "retired",
}


@portal_action(back=_use_case_url)
@require_POST
def use_case_transition_view(request: HttpRequest, pk: int) -> HttpResponse:
    use_case = _use_case_for(request, pk)
    form = UseCaseTransitionForm(request.POST)
    if not form.is_valid():
        raise ValidationError("Choose a valid action.")
    transition = form.cleaned_data["transition"]
    use_case_transition(
        actor=_actor(request),
        use_case=use_case,
        transition=transition,
        reason=form.cleaned_data["reason"],
    )
    messages.success(request, f"Use case {use_case} {TRANSITION_DONE.get(transition, transition)}.")
    return redirect(_back(request, _use_case_url(use_case.pk)))


def _form_error(form: forms.Form) -> ValidationError:
    """The form's first complaint, named by its field, for the message on the page."""
    name, errors = next(iter(form.errors.items()))
    label = form[name].label if name in form.fields else name
    return ValidationError(f"{label}: {' '.join(str(e) for e in errors)}")


@portal_action(back=_use_case_url)
@require_POST
def use_case_records(request: HttpRequest, pk: int) -> HttpResponse:
    """An officer sets what the gateway records for this use case (audited by the service)."""
    use_case = _use_case_for(request, pk)
    form = RecordSettingsForm(request.POST)
    if not form.is_valid():
        raise _form_error(form)
    data = form.cleaned_data
    use_case_set_records(
        actor=_actor(request),
        use_case=use_case,
        policy=data["record_policy"],
        retention_days=data["record_retention_days"],
        developers_can_read=data["records_visible_to_developers"],
    )
    messages.success(request, f"Record settings of {use_case} saved.")
    return redirect(_use_case_url(use_case.pk))


@portal_action(back=_use_case_url)
@require_POST
def use_case_legal_hold(request: HttpRequest, pk: int) -> HttpResponse:
    """An officer places or lifts a legal hold on this use case or on its whole tenant."""
    use_case = _use_case_for(request, pk)
    form = LegalHoldForm(request.POST)
    if not form.is_valid():
        raise _form_error(form)
    hold, reason = form.cleaned_data["hold"], form.cleaned_data["reason"]
    if form.cleaned_data["target"] == "tenant":
        tenant_set_legal_hold(
            actor=_actor(request), tenant=use_case.tenant, hold=hold, reason=reason
        )
        what = f"tenant {use_case.tenant.slug}"
    else:
        use_case_set_legal_hold(actor=_actor(request), use_case=use_case, hold=hold, reason=reason)
        what = f"use case {use_case}"
    messages.success(request, f"Legal hold on {what} {'placed' if hold else 'lifted'}.")
    return redirect(_use_case_url(use_case.pk))


class LocalLoginView(auth_views.LoginView):
    """Username/password login: the embedded demo's stand-in for Keycloak SSO."""

    template_name = "registration/login.html"

    def dispatch(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponseBase:
        if not settings.LOCAL_LOGIN_ENABLED:
            raise Http404("Local login is disabled; sign in with SSO.")
        return super().dispatch(request, *args, **kwargs)
