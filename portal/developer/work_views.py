""" "My work": the files and async tasks of the use cases a person may see, on one page.

Thin: which use cases is ``governance.selectors.use_cases_visible`` (a developer: their
tenants'; officers, auditors and admins: every tenant's), the files are
``scheduler.files.selectors``, the tasks ``portal.developer.work_tasks``. Files come from the
database and tasks from Valkey: when Valkey cannot be reached the page still answers (200)
with the files and says the tasks cannot be read now.
"""

from __future__ import annotations

from typing import Any

import orjson
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from governance.audit import Actor
from governance.models import UseCase
from governance.roles import can_read_everything, roles_of
from governance.selectors import use_cases_visible
from governance.store import valkey_client
from portal.developer.work_tasks import TaskPage, task_read, tasks_page
from runtime.valkey_urls import VALKEY_FAILURES
from scheduler.files.selectors import files_visible, with_parts_counts

FILES_PER_PAGE = 20
REFRESH_SECONDS = 3  # the tasks table's refresh while a task of it is queued or running


def _require_role(request: HttpRequest) -> None:
    if not roles_of(request.user):
        raise Http404("This page shows the work of a person's use cases.")


def _use_case_ids(request: HttpRequest) -> list[int]:
    return list(use_cases_visible(request.user).values_list("pk", flat=True))


def _cursor(request: HttpRequest) -> int:
    raw = request.GET.get("cursor", "")
    return int(raw) if raw.isdigit() and len(raw) <= 20 else 0


def _tasks_context(request: HttpRequest) -> dict[str, Any]:
    """The tasks table's context; ``tasks_unavailable`` when Valkey cannot be read."""
    cursor = _cursor(request)
    try:
        page: TaskPage | None = tasks_page(
            valkey_client(), use_case_ids=_use_case_ids(request), cursor=cursor
        )
    except VALKEY_FAILURES:
        page = None
    rows = page.rows if page else []
    use_cases = UseCase.objects.select_related("tenant").in_bulk({row.use_case_id for row in rows})
    return {
        "tasks": [(row, use_cases.get(row.use_case_id)) for row in rows],
        "tasks_page": page,
        "tasks_unavailable": page is None,
        "cursor": cursor,
        "refresh_seconds": REFRESH_SECONDS,
    }


@login_required
@require_GET
def my_work(request: HttpRequest) -> HttpResponse:
    """Files (newest first, paginated) and one page of async tasks."""
    _require_role(request)
    files = with_parts_counts(files_visible(request.user).order_by("-created_at", "-pk"))
    files_page = Paginator(files, FILES_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "portal/developer/my_work.html",
        {
            "page": files_page,
            "sees_everything": can_read_everything(request.user),
            **_tasks_context(request),
        },
    )


@login_required
@require_GET
def my_work_tasks(request: HttpRequest) -> HttpResponse:
    """The tasks table alone: what the page's htmx refresh swaps in."""
    _require_role(request)
    response = render(request, "portal/developer/_work_tasks.html", _tasks_context(request))
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_GET
def my_work_task(request: HttpRequest, task_id: str) -> HttpResponse:
    """One task as the gateway's ``GET /v1/tasks/{id}`` answers it (same JSON), for the
    people who may see its use case; anyone else gets 404, as from the API. Reading an
    ended task's result or error is audited."""
    _require_role(request)
    try:
        document = task_read(
            valkey_client(),
            actor=Actor.from_request(request),
            task_id=task_id,
            use_case_ids=_use_case_ids(request),
        )
    except VALKEY_FAILURES:
        error = {
            "error": {
                "message": "The task store cannot be reached now.",
                "type": "server_error",
                "param": None,
                "code": "tasks_unavailable",
            }
        }
        return HttpResponse(orjson.dumps(error), content_type="application/json", status=503)
    if document is None:
        raise Http404("No such task.")
    response = HttpResponse(orjson.dumps(document), content_type="application/json")
    response["Cache-Control"] = "no-store"
    return response
