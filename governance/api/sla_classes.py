"""``/api/sla-classes/``: officers set a use case's file SLAs; its developers and auditors read.

Thin: the serializer checks types, ``governance.sla_classes`` checks everything else (windows,
time zone, turnaround, kinds, in-use on delete), so the API, the admin and policy as code give
the same answer with the same words.
"""

from __future__ import annotations

from typing import Any, cast

from django.db.models import Model as DjangoModel
from django.db.models import QuerySet
from rest_framework import serializers
from rest_framework.serializers import BaseSerializer

from governance.api.filtersets import SlaClassFilterSet
from governance.api.serializers import UniqueListField
from governance.api.views import GovernedViewSet, ScopedRelations, actor_of
from governance.choices import SLA_CLASS_FIELDS, FileKind
from governance.models import PriorityClass, SlaClass
from governance.selectors import sla_classes_visible, use_cases_visible
from governance.sla_classes import sla_class_create, sla_class_delete, sla_class_update


class SlaClassSerializer(serializers.ModelSerializer[SlaClass]):
    priority_class = serializers.SlugRelatedField(
        slug_field="name", queryset=PriorityClass.objects.all()
    )
    windows = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        help_text='e.g. [{"days": ["mon", "tue"], "start": "20:00", "end": "06:00"}]; '
        "empty: any time",
    )
    kinds = UniqueListField(
        child=serializers.ChoiceField(choices=FileKind.choices),
        min_length=1,
        help_text="File kinds this class takes",
    )
    turnaround_seconds = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=60,
        max_value=2**31 - 1,
        help_text="Done within this long of the upload; null: by the end of the next window",
    )
    max_file_bytes = serializers.IntegerField(required=False, min_value=1, max_value=2**63 - 1)

    class Meta:
        model = SlaClass
        fields = (
            "id",
            "use_case",
            *SLA_CLASS_FIELDS,
            "created_at",
            "updated_at",
        )
        read_only_fields = ("created_at", "updated_at")
        # Uniqueness per use case is the service's rule, with a message naming the field.
        validators: list[Any] = []


class SlaClassViewSet(ScopedRelations, GovernedViewSet):
    """SLA classes per use case: officers and admins write (the services check it); the
    tenant's developers and auditors read."""

    serializer_class = SlaClassSerializer
    scoped_relations = {"use_case": (use_cases_visible, "No such use case.")}
    filterset_class = SlaClassFilterSet

    def get_queryset(self) -> QuerySet[SlaClass]:
        return sla_classes_visible(self.request.user).order_by("use_case_id", "name")

    def perform_create(self, serializer: BaseSerializer[Any]) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = sla_class_create(actor=actor_of(self.request), **data)

    def perform_update(self, serializer: BaseSerializer[Any]) -> None:
        serializer.instance = sla_class_update(
            actor=actor_of(self.request),
            sla_class=cast(SlaClass, serializer.instance),
            changes=dict(serializer.validated_data),
        )

    def perform_destroy(self, instance: DjangoModel) -> None:
        sla_class_delete(actor=actor_of(self.request), sla_class=cast(SlaClass, instance))
