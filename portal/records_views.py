"""The auditors' pages: search records, read one transcript, download exports, the audit trail.

Thin: each view parses the query into the shared search form, calls
``scheduler.record_reading`` (which decides who sees what and audits every read of content
and every download) or ``governance.audit_export``, and renders. Nothing here changes a
record. A record a person may not read is a 404, like one that does not exist.
"""

from __future__ import annotations

from typing import Any

import orjson
from django import forms
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.views.decorators.http import require_GET

from governance.audit import Actor, audit_verify
from governance.audit_export import AuditExportRange, audit_export, signing_public_key
from governance.audit_export import export_filename as audit_export_filename
from governance.downloads import download_response
from governance.models import AuditEvent
from governance.roles import can_read_everything
from scheduler.models import InteractionRecord
from scheduler.record_reading import (
    EXPORT_FORMATS,
    RECORDS_PER_PAGE,
    ExportRefused,
    RecordSearchForm,
    UtcDateTimeField,
    export_check,
    export_content_type,
    export_filename,
    export_limit,
    may_search_records,
    record_find,
    record_rows,
    records_export,
    records_search,
    transcript_read,
)

AUDIT_EVENTS_PER_PAGE = 50
DETAILS_CHARS = 240


def _require_records(request: HttpRequest) -> None:
    if not may_search_records(request.user):
        raise Http404("Records are for auditors, officers and developers.")


def _search_page(
    request: HttpRequest, form: RecordSearchForm, *, problem: str = "", status: int = 200
) -> HttpResponse:
    page = None
    rows = []
    if form.is_valid():
        found = records_search(request.user, form.record_filter())
        page = Paginator(found, RECORDS_PER_PAGE).get_page(request.GET.get("page"))
        rows = record_rows(list(page.object_list))
    return render(
        request,
        "portal/records.html",
        {
            "form": form,
            "page": page,
            "rows": rows,
            "searched": any(form.data.get(name) for name in form.fields),
            "sees_everything": can_read_everything(request.user),
            "formats": EXPORT_FORMATS,
            "export_limit": f"{export_limit():,}",
            "problem": problem,
        },
        status=status,
    )


@login_required
@require_GET
def records(request: HttpRequest) -> HttpResponse:
    """Search records, newest first, and download the selection."""
    _require_records(request)
    return _search_page(request, RecordSearchForm(request.GET, user=request.user))


@login_required
@require_GET
def record_detail(request: HttpRequest, record_id: str) -> HttpResponse:
    """One transcript: metadata, decisions, findings and, where kept, the content (audited)."""
    _require_records(request)
    try:
        record = record_find(request.user, record_id)
    except InteractionRecord.DoesNotExist:
        raise Http404("No such record.") from None
    transcript = transcript_read(actor=Actor.from_request(request), record=record)
    return render(request, "portal/record_detail.html", {"t": transcript})


@login_required
@require_GET
def records_export_download(request: HttpRequest) -> HttpResponseBase:
    """The search's selection as JSON Lines or CSV, streamed; audited when it ends."""
    _require_records(request)
    form = RecordSearchForm(request.GET, user=request.user)
    if not form.is_valid():
        return _search_page(request, form, status=400)
    fmt = request.GET.get("format", "jsonl")
    found = form.record_filter()
    rows = records_search(request.user, found)
    try:
        export_check(rows=rows, fmt=fmt)
    except ExportRefused as refused:
        return _search_page(request, form, problem=str(refused), status=400)
    chunks = records_export(
        actor=Actor.from_request(request), rows=rows, fmt=fmt, described=found.describe()
    )
    return download_response(
        request, chunks, filename=export_filename(fmt), content_type=export_content_type(fmt)
    )


# --- the audit trail ----------------------------------------------------------------------
class AuditSearchForm(forms.Form):
    action = forms.CharField(required=False, max_length=64, help_text="e.g. records.exported")
    actor = forms.CharField(required=False, max_length=150, help_text="A username.")
    tenant = forms.CharField(required=False, max_length=63, help_text="A tenant's slug.")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)


class AuditExportForm(forms.Form):
    from_sequence = forms.IntegerField(
        required=False, min_value=1, max_value=2**63 - 1, label="From event #"
    )
    to_sequence = forms.IntegerField(
        required=False, min_value=1, max_value=2**63 - 1, label="To event #"
    )
    since = UtcDateTimeField(required=False, label="From (UTC)")
    until = UtcDateTimeField(required=False, label="To (UTC)")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)

    def wanted(self) -> AuditExportRange:
        data = self.cleaned_data
        return AuditExportRange(
            from_sequence=data.get("from_sequence"),
            to_sequence=data.get("to_sequence"),
            since=data.get("since"),
            until=data.get("until"),
        )


def _details(after: Any) -> str:
    """An event's ``after`` as compact JSON, cut to a line's worth."""
    if not after:
        return ""
    text = orjson.dumps(after).decode()
    return text if len(text) <= DETAILS_CHARS else text[: DETAILS_CHARS - 1] + "…"


def _require_audit(request: HttpRequest) -> None:
    if not can_read_everything(request.user):
        raise Http404("The audit trail page is for auditors and officers.")


@login_required
@require_GET
def audit_trail(request: HttpRequest) -> HttpResponse:
    """Recent audit events, the chain's verification, and the signed export."""
    _require_audit(request)
    form = AuditSearchForm(request.GET)
    page = None
    if form.is_valid():
        events = AuditEvent.objects.order_by("-sequence")
        data = form.cleaned_data
        if data["action"]:
            events = events.filter(action=data["action"].strip())
        if data["actor"]:
            events = events.filter(actor=data["actor"].strip())
        if data["tenant"]:
            events = events.filter(tenant_slug=data["tenant"].strip())
        page = Paginator(events, AUDIT_EVENTS_PER_PAGE).get_page(request.GET.get("page"))
    rows = [(event, _details(event.after)) for event in (page.object_list if page else [])]
    return render(
        request,
        "portal/audit_trail.html",
        {
            "form": form,
            "page": page,
            "rows": rows,
            "chain": audit_verify(),
            "export_form": AuditExportForm(),
            "public_key": signing_public_key(),
            "searched": any(form.data.get(name) for name in form.fields),
        },
    )


@login_required
@require_GET
def audit_export_download(request: HttpRequest) -> HttpResponseBase:
    """The signed audit trail (JSON Lines), streamed; the download is itself audited."""
    _require_audit(request)
    form = AuditExportForm(request.GET)
    if not form.is_valid():
        return render(
            request,
            "portal/audit_trail.html",
            {
                "form": AuditSearchForm(),
                "page": None,
                "chain": audit_verify(),
                "export_form": form,
                "public_key": signing_public_key(),
            },
            status=400,
        )
    chunks = audit_export(actor=Actor.from_request(request), wanted=form.wanted())
    return download_response(
        request, chunks, filename=audit_export_filename(), content_type="application/jsonl"
    )
