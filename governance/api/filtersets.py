"""Query filters of the governance API.

A filter on a related record offers only the records the person may see, so filtering by one
outside their scope gets the same 400 as filtering by one that does not exist.

Time bounds are taken to UTC before they reach the database: ISO 8601 admits offsets up to
±23:59, PostgreSQL only ±15:59, and a bound the database cannot read was a 500.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import django_filters  # type: ignore[import-untyped]  # no stubs published
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django_filters.rest_framework import DjangoFilterBackend  # type: ignore[import-untyped]

from governance.models import ApiKey, GuardrailSelection, SlaClass, UseCase
from governance.selectors import use_cases_visible


class UtcIsoDateTimeField(django_filters.fields.IsoDateTimeField):  # type: ignore[misc]
    def to_python(self, value: object) -> datetime | None:
        parsed: datetime | None = super().to_python(value)  # aware, in any offset
        if parsed is None:
            return None
        try:
            return parsed.astimezone(UTC)
        except OverflowError:
            raise ValidationError("Enter a time that exists in UTC.", code="invalid") from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):  # type: ignore[misc]
    field_class = UtcIsoDateTimeField


class FilterSet(django_filters.rest_framework.FilterSet):  # type: ignore[misc]
    """The base of every API filter set, declared or made from ``filterset_fields``."""

    FILTER_DEFAULTS = copy.deepcopy(django_filters.rest_framework.FilterSet.FILTER_DEFAULTS)
    FILTER_DEFAULTS[models.DateTimeField] = {"filter_class": UtcIsoDateTimeFilter}


class FilterBackend(DjangoFilterBackend):  # type: ignore[misc]
    filterset_base = FilterSet


def _visible_use_cases(request: HttpRequest | None) -> QuerySet[UseCase]:
    # The schema generator builds filters without a request: it documents, it never filters.
    if request is None:
        return UseCase.objects.none()
    return use_cases_visible(request.user)


class ApiKeyFilterSet(FilterSet):
    use_case = django_filters.ModelChoiceFilter(queryset=_visible_use_cases)

    class Meta:
        model = ApiKey
        fields: Any = ("use_case", "status", "use_case__tenant__slug")


class GuardrailSelectionFilterSet(FilterSet):
    use_case = django_filters.ModelChoiceFilter(queryset=_visible_use_cases)

    class Meta:
        model = GuardrailSelection
        fields: Any = ("use_case", "guardrail", "side", "action")


class SlaClassFilterSet(FilterSet):
    use_case = django_filters.ModelChoiceFilter(queryset=_visible_use_cases)

    class Meta:
        model = SlaClass
        fields: Any = ("use_case", "name")
