"""Usage pages: a use case's charts (with their tables and CSVs) and a developer's budget.

Both read through ``portal.selectors.use_cases_visible``: a use case outside the person's
tenants is a 404, so its existence does not leak. Officers, auditors and admins see every use
case's charts; a developer those of their own tenants.
"""

from __future__ import annotations

import csv
from datetime import UTC

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils.cache import patch_vary_headers
from django.utils.timezone import now
from django_htmx.middleware import HtmxDetails

from governance.models import UseCase
from governance.prices import currency
from governance.roles import Role, has_role
from governance.store import valkey_client
from portal import selectors
from portal.charts.budget import use_case_budgets
from portal.charts.series import (
    CHART_NAMES,
    DEFAULT_RANGE,
    RANGES,
    REFUSALS,
    TimeRange,
    chart_named,
    use_case_charts,
)
from portal.charts.spend import spend_by_use_case
from records.models import AdmissionDecision
from records.selectors import admission_decisions_visible

USE_CASES_PER_PAGE = 10
RECENT_REFUSALS = 10


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails  # set by django_htmx's middleware


def _range(request: HttpRequest) -> TimeRange:
    return RANGES.get(request.GET.get("range", ""), RANGES[DEFAULT_RANGE])


def _use_case_for(request: HttpRequest, pk: int) -> UseCase:
    return get_object_or_404(selectors.use_cases_visible(request.user), pk=pk)


@login_required
def use_case_usage(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    use_case = _use_case_for(request, pk)
    time_range = _range(request)
    context = {
        "use_case": use_case,
        "range": time_range,
        "ranges": RANGES.values(),
        "charts": use_case_charts(use_case.pk, time_range, now()),
    }
    # The range links are htmx requests: answer them with the charts alone. A history
    # restore (back button after a cache miss) swaps the whole body: it gets the whole page.
    partial = bool(request.htmx) and not request.htmx.history_restore_request
    template = "portal/usage/_charts.html" if partial else "portal/usage/use_case.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))  # never cache one answer for the other
    return response


@login_required
def use_case_usage_csv(request: HttpRequest, pk: int, chart: str) -> HttpResponse:
    use_case = _use_case_for(request, pk)
    if chart not in CHART_NAMES:
        raise Http404("No such chart.")
    time_range = _range(request)
    found = chart_named(use_case_charts(use_case.pk, time_range, now()), chart)
    assert found is not None
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    name = f"{use_case.tenant.slug}-{use_case.slug}-{chart}-{time_range.name}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    csv.writer(response, lineterminator="\n").writerows(found.csv_rows())
    return response


@login_required
def my_usage(request: HttpRequest) -> HttpResponse:
    """A developer's use cases: the limits in force, what is left of each window now, what
    they spent this month, and the latest refusals with their reasons."""
    user = request.user
    if not has_role(user, Role.DEVELOPER):
        raise Http404("This page shows a developer's own use cases.")
    mine = (
        UseCase.objects.filter(tenant__members=user)  # type: ignore[misc]
        .select_related("tenant")
        .prefetch_related("allowed_models")
        .order_by("tenant__slug", "slug")
    )
    page = Paginator(mine, USE_CASES_PER_PAGE).get_page(request.GET.get("page"))
    use_cases = list(page.object_list)
    budgets = use_case_budgets(use_cases, client=valkey_client())
    month_start = now().astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    spend = spend_by_use_case([uc.pk for uc in use_cases], month_start)
    refusals = admission_decisions_visible(user).filter(decision__in=REFUSALS)
    entries = []
    for uc in use_cases:
        recent = list(
            refusals.filter(use_case_id=uc.pk).order_by("-occurred_at", "-id")[:RECENT_REFUSALS]
        )
        entries.append(
            {
                "use_case": uc,
                "budget": budgets.by_use_case.get(uc.pk),
                "spend": spend[uc.pk],
                "refusals": [
                    (d, selectors.decision_reason_text(d.decision, d.reason)) for d in recent
                ],
            }
        )
    return render(
        request,
        "portal/usage/my_usage.html",
        {
            "page": page,
            "entries": entries,
            "budgets_available": budgets.available,
            "month_start": month_start,
            "currency": currency(),
            "refused_kind": AdmissionDecision.Kind,
        },
    )
