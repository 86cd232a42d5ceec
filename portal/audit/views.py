"""The audit trail pages. Thin: parse the query, call governance.audit / audit_export, render.

Officers, admins and auditors may read the whole trail (``can_read_everything``); anyone else
gets a 404, as for a page that does not exist. Each view, verification and download is
recorded in the trail it reads (``audit.viewed``, ``audit.verified``, ``audit.exported``).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import orjson
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from governance.audit import Actor, audit_record, audit_verify
from governance.audit_export import audit_export, signing_public_key
from governance.audit_export import export_filename as audit_export_filename
from governance.models import AuditEvent
from governance.roles import can_read_everything
from governance.streamed_downloads import download_response
from portal.audit.forms import AuditExportForm, AuditSearchForm
from portal.audit.selectors import (
    VERIFIED,
    VIEWED,
    Verification,
    last_verification,
    own_activity,
)

AUDIT_EVENTS_PER_PAGE = 50
DETAILS_CHARS = 240


def _details(after: Any) -> str:
    """An event's ``after`` as compact JSON, cut to a line's worth."""
    if not after:
        return ""
    text = orjson.dumps(after).decode()
    return text if len(text) <= DETAILS_CHARS else text[: DETAILS_CHARS - 1] + "…"


def _require_audit(request: HttpRequest) -> None:
    if not can_read_everything(request.user):
        raise Http404("The audit trail page is for auditors and officers.")


def _page(
    request: HttpRequest,
    *,
    form: AuditSearchForm,
    export_form: AuditExportForm,
    viewed: AuditEvent | None,
    status: int = 200,
) -> HttpResponse:
    page = None
    if form.is_valid():
        page = Paginator(form.filtered(), AUDIT_EVENTS_PER_PAGE).get_page(request.GET.get("page"))
    rows = [(event, _details(event.after)) for event in (page.object_list if page else [])]
    return render(
        request,
        "portal/audit_trail.html",
        {
            "form": form,
            "page": page,
            "rows": rows,
            "verification": last_verification(),
            "export_form": export_form,
            "public_key": signing_public_key(),
            "searched": bool(form.described()),
            "viewed": viewed,
            "own_activity": own_activity(request.user.get_username()),
        },
        status=status,
    )


@login_required
@require_GET
def audit_trail(request: HttpRequest) -> HttpResponse:
    """The events, filtered and paginated; the last verification; the signed export. The view
    itself is recorded first, so it is the newest row of an unfiltered trail."""
    _require_audit(request)
    form = AuditSearchForm(request.GET)
    viewed = audit_record(
        actor=Actor.from_request(request),
        action=VIEWED,
        object_repr="the audit trail",
        after={"filter": form.described(), "page": str(request.GET.get("page", "1"))[:20]},
    )
    status = 200 if form.is_valid() else 400
    return _page(request, form=form, export_form=AuditExportForm(), viewed=viewed, status=status)


@login_required
@require_POST
def audit_chain_verify(request: HttpRequest) -> HttpResponse:
    """Walk the whole chain against the signed checkpoints, as ``manage.py audit_verify``
    does, and record the result. From htmx the answer is the result alone (no page view to
    record); without JavaScript, back to the page, which shows it."""
    _require_audit(request)
    report = audit_verify()
    event = audit_record(
        actor=Actor.from_request(request),
        action=VERIFIED,
        object_repr="the audit chain",
        after=asdict(report),
    )
    if getattr(request, "htmx", False):  # django-htmx: true for an htmx call
        return render(
            request,
            "portal/_audit_verification.html",
            {"verification": Verification.from_event(event)},
        )
    return redirect(reverse("portal:audit_trail") + "#chain-heading")


@login_required
@require_GET
def audit_export_download(request: HttpRequest) -> HttpResponseBase:
    """The signed audit trail (JSON Lines), streamed; the download is itself audited."""
    _require_audit(request)
    export_form = AuditExportForm(request.GET)
    if not export_form.is_valid():
        return _page(
            request, form=AuditSearchForm(), export_form=export_form, viewed=None, status=400
        )
    chunks = audit_export(actor=Actor.from_request(request), wanted=export_form.wanted())
    return download_response(
        request, chunks, filename=audit_export_filename(), content_type="application/jsonl"
    )
