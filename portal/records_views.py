"""The auditors' pages: search records, read one transcript, download exports (the audit
trail is in portal.audit).

Thin: each view parses the query into the shared search form, calls
``records.reading`` (which decides who sees what and audits every read of content
and every download) and renders. Nothing here changes a
record. A record a person may not read is a 404, like one that does not exist.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.views.decorators.http import require_GET

from governance.audit import Actor
from governance.roles import can_read_everything
from governance.streamed_downloads import download_response
from records.models import InteractionRecord
from records.reading import (
    EXPORT_FORMATS,
    RECORDS_PER_PAGE,
    ExportRefused,
    RecordSearchForm,
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
    """The search's selection as JSON Lines or CSV, streamed; audited when it starts and
    when it ends."""
    _require_records(request)
    form = RecordSearchForm(request.GET, user=request.user)
    if not form.is_valid():
        return _search_page(request, form, status=400)
    fmt = request.GET.get("format", "jsonl")
    found = form.record_filter()
    rows = records_search(request.user, found)
    try:
        expected = export_check(rows=rows, fmt=fmt)
    except ExportRefused as refused:
        return _search_page(request, form, problem=str(refused), status=400)
    chunks = records_export(
        actor=Actor.from_request(request),
        rows=rows,
        fmt=fmt,
        described=found.describe(),
        expected=expected,
    )
    return download_response(
        request, chunks, filename=export_filename(fmt), content_type=export_content_type(fmt)
    )
