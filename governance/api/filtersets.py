"""Query filters of the governance API that name other records.

A filter on a related record offers only the records the person may see, so filtering by one
outside their scope gets the same 400 as filtering by one that does not exist.
"""

from __future__ import annotations

from typing import Any

import django_filters  # type: ignore[import-untyped]  # no stubs published
from django.db.models import QuerySet
from django.http import HttpRequest

from governance.models import ApiKey, GuardrailSelection, UseCase
from governance.selectors import use_cases_visible


def _visible_use_cases(request: HttpRequest | None) -> QuerySet[UseCase]:
    # The schema generator builds filters without a request: it documents, it never filters.
    if request is None:
        return UseCase.objects.none()
    return use_cases_visible(request.user)


class ApiKeyFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    use_case = django_filters.ModelChoiceFilter(queryset=_visible_use_cases)

    class Meta:
        model = ApiKey
        fields: Any = ("use_case", "status", "use_case__tenant__slug")


class GuardrailSelectionFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    use_case = django_filters.ModelChoiceFilter(queryset=_visible_use_cases)

    class Meta:
        model = GuardrailSelection
        fields: Any = ("use_case", "guardrail", "side", "action")
