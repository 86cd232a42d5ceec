"""The files pages: the registrations a person may see, one file's progress (polled live),
its parts, history and outputs, and the audited listen / download of its objects.

Thin: who sees what is ``scheduler.files.selectors``; what a download is and its audit event
is ``scheduler.files.audited_downloads``; cancelling is
``scheduler.files.registration.file_cancel``. A file a person may not see is a 404, like one
that does not exist.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
)
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from governance.audit import Actor
from governance.choices import FileKind, FileState
from governance.errors import Conflict
from governance.models import FileRegistration
from governance.roles import can_read_everything, roles_of
from governance.selectors import use_cases_visible
from runtime.valkey_urls import VALKEY_FAILURES
from scheduler.files.audited_downloads import ORIGINAL, file_download_response, output_names
from scheduler.files.registration import file_cancel
from scheduler.files.selectors import (
    file_find,
    file_history,
    file_parts,
    files_visible,
    is_final,
    may_cancel,
    parts_summary,
)

FILES_PER_PAGE = 50
POLL_MILLISECONDS = 2000


class FileFilterForm(forms.Form):
    use_case = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    state = forms.ChoiceField(required=False, choices=[("", "Any state"), *FileState.choices])
    kind = forms.ChoiceField(required=False, choices=[("", "Any kind"), *FileKind.choices])

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
        use_case_field = self.fields["use_case"]
        assert isinstance(use_case_field, forms.TypedChoiceField)
        use_case_field.choices = [("", "Any use case")] + [
            (uc.pk, str(uc)) for uc in use_cases_visible(user).order_by("tenant__slug", "slug")
        ]


class CancelForm(forms.Form):
    reason = forms.CharField(
        required=False, max_length=300, label="Reason (kept in the audit trail)"
    )


def _require_role(request: HttpRequest) -> None:
    if not roles_of(request.user):
        raise Http404("The files pages are for officers, auditors and developers.")


def _file_for(request: HttpRequest, pk: int) -> FileRegistration:
    _require_role(request)
    try:
        return file_find(request.user, pk)
    except FileRegistration.DoesNotExist:
        raise Http404("No such file.") from None


def _progress_context(file: FileRegistration) -> dict[str, Any]:
    return {
        "file": file,
        "percent": round(file.progress * 100),
        "parts": parts_summary(file),
        "part_rows": file_parts(file),
        "outputs": output_names(file),
        "final": is_final(file),
        "history": file_history(file),
    }


@login_required
@require_GET
def files(request: HttpRequest) -> HttpResponse:
    """The files a person may see, newest first, filtered by use case, state and kind."""
    _require_role(request)
    form = FileFilterForm(request.GET, user=request.user)
    page = None
    if form.is_valid():
        found = files_visible(request.user).order_by("-created_at", "-pk")
        data = form.cleaned_data
        if data["use_case"]:
            found = found.filter(use_case_id=data["use_case"])
        if data["state"]:
            found = found.filter(state=data["state"])
        if data["kind"]:
            found = found.filter(kind=data["kind"])
        page = Paginator(found, FILES_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "portal/files/list.html",
        {
            "form": form,
            "page": page,
            "searched": any(form.data.get(name) for name in form.fields),
            "sees_everything": can_read_everything(request.user),
        },
        status=200 if form.is_valid() else 400,
    )


@login_required
@require_GET
def file_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """One file: its registration, live progress, parts, history, outputs and original."""
    file = _file_for(request, pk)
    return render(
        request,
        "portal/files/detail.html",
        {
            **_progress_context(file),
            "may_cancel": may_cancel(request.user, file),
            "cancel_form": CancelForm(),
            "poll_ms": POLL_MILLISECONDS,
            "is_audio": file.kind == FileKind.AUDIO,
        },
    )


@login_required
@require_GET
def file_progress(request: HttpRequest, pk: int) -> HttpResponse:
    """The live part of the detail page, polled every couple of seconds until the file ends."""
    file = _file_for(request, pk)
    response = render(request, "portal/files/_progress.html", _progress_context(file))
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def file_cancel_view(request: HttpRequest, pk: int) -> HttpResponse:
    file = _file_for(request, pk)
    form = CancelForm(request.POST)
    if not form.is_valid():
        messages.error(request, "The reason is at most 300 characters.")
    else:
        try:
            file_cancel(
                actor=Actor.from_request(request),
                file=file,
                reason=form.cleaned_data["reason"],
            )
        except PermissionDenied as refused:
            messages.error(request, str(refused))
        except Conflict as conflict:
            messages.error(request, str(conflict))
        except VALKEY_FAILURES:
            messages.error(
                request, "The scheduler's store cannot be reached; the file is not cancelled."
            )
        else:
            messages.success(request, f"{file.filename} is cancelled and its promise released.")
    return HttpResponseRedirect(reverse("portal:file_detail", args=[file.pk]))


@login_required
@require_GET
def file_original(request: HttpRequest, pk: int) -> HttpResponseBase:
    """The uploaded original, with Range support so that the audio player can seek; audited."""
    return file_download_response(request, _file_for(request, pk), ORIGINAL)


@login_required
@require_GET
def file_output(request: HttpRequest, pk: int, name: str) -> HttpResponseBase:
    """One output (transcript, summary, results…) as an attachment; audited."""
    if name == ORIGINAL:
        raise Http404("No such output.")
    return file_download_response(request, _file_for(request, pk), name)
