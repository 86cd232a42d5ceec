"""The dead-letters page: async tasks that failed every attempt, for officers to replay or
discard (docs/async.md "Dead letters").

Thin: who sees and who decides is ``governance.dead_letters``. Officers and admins act;
auditors see the same table without the buttons; anyone else finds no such page (404), as
with the review queue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from gateway.async_tasks.layout import MAX_ATTEMPTS
from governance.audit import Actor
from governance.dead_letters import (
    DeadLetter,
    dead_letter_discard,
    dead_letter_replay,
    dead_letters_list,
    is_entry_id,
)
from governance.errors import GovernanceError
from governance.models import UseCase
from governance.roles import can_govern, can_read_everything
from runtime.valkey_urls import VALKEY_FAILURES

DEAD_LETTERS_PER_PAGE = 50
_UNREACHABLE = "The task store (Valkey) cannot be reached; nothing was changed. Try again shortly."


def _require_reader(request: HttpRequest) -> None:
    if not can_read_everything(request.user):
        raise Http404("The dead letters are for governance officers and auditors.")


def _cursor(value: str | None) -> str | None:
    return value if value and is_entry_id(value) else None


def _list_url(before: str | None) -> str:
    url = reverse("portal:async_dead_letters")
    return f"{url}?{urlencode({'before': before})}" if before else url


def _use_cases(letters: list[DeadLetter]) -> dict[int, UseCase]:
    ids = {letter.use_case_id for letter in letters if letter.use_case_id is not None}
    return UseCase.objects.select_related("tenant").in_bulk(ids)


@login_required
@require_GET
def dead_letters(request: HttpRequest) -> HttpResponse:
    """Dead letters newest first, a page at a time (``before``: the previous page's last)."""
    _require_reader(request)
    before = _cursor(request.GET.get("before"))
    context: dict[str, Any] = {
        "can_decide": can_govern(request.user),
        "max_attempts": MAX_ATTEMPTS,
        "before": before,
        "first_page": reverse("portal:async_dead_letters"),
        "rows": [],
        "older": None,
        "unreachable": False,
    }
    try:
        page = dead_letters_list(user=request.user, count=DEAD_LETTERS_PER_PAGE, before=before)
    except VALKEY_FAILURES:
        context["unreachable"] = True
        return render(request, "portal/async/dead_letters.html", context, status=503)
    use_cases = _use_cases(page.letters)
    context["rows"] = [
        (letter, use_cases.get(letter.use_case_id) if letter.use_case_id is not None else None)
        for letter in page.letters
    ]
    context["older"] = _list_url(page.next_before) if page.next_before else None
    return render(request, "portal/async/dead_letters.html", context)


def _decide(
    request: HttpRequest,
    entry_id: str,
    service: Callable[..., Any],
    done: Callable[[Any], str],
) -> HttpResponse:
    """Run one decision and come back to the page the button was on."""
    _require_reader(request)
    back = _list_url(_cursor(request.POST.get("before")))
    try:
        outcome = service(actor=Actor.from_request(request), entry_id=entry_id)
    except PermissionDenied as refused:
        return render(
            request,
            "portal/refused.html",
            {"message": str(refused) or "You may not do this.", "back": back},
            status=403,
        )
    except GovernanceError as problem:  # gone (NotFound) or cannot run again (Conflict)
        messages.error(request, str(problem))
    except VALKEY_FAILURES:
        messages.error(request, _UNREACHABLE)
    else:
        messages.success(request, done(outcome))
    return HttpResponseRedirect(back)


@login_required
@require_POST
def dead_letter_replay_view(request: HttpRequest, entry_id: str) -> HttpResponse:
    return _decide(
        request,
        entry_id,
        dead_letter_replay,
        lambda replayed: f"Task {replayed.letter.task_id} is queued again (attempts reset).",
    )


@login_required
@require_POST
def dead_letter_discard_view(request: HttpRequest, entry_id: str) -> HttpResponse:
    return _decide(
        request,
        entry_id,
        dead_letter_discard,
        lambda letter: f"The dead letter of task {letter.task_id} is discarded.",
    )
