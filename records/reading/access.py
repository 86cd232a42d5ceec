"""Who reads which records: the one rule (docs/records.md, "Who sees what")."""

from __future__ import annotations

from django.db.models import QuerySet

from governance.models import Tenant, UseCase
from governance.roles import AnyUser, Role, can_read_everything, has_role
from records.models import InteractionRecord


def records_visible_to(user: AnyUser) -> QuerySet[InteractionRecord]:
    """The one place that decides which records a person may read (see the module doc)."""
    if can_read_everything(user):
        return InteractionRecord.objects.all()
    if has_role(user, Role.DEVELOPER):
        use_cases = UseCase.objects.filter(
            tenant__members=user,  # type: ignore[misc]
            records_visible_to_developers=True,
        ).values_list("pk", flat=True)
        return InteractionRecord.objects.filter(use_case_id__in=list(use_cases))
    return InteractionRecord.objects.none()


def may_search_records(user: AnyUser) -> bool:
    """Whether the records pages are for this person at all (developers may have none)."""
    return can_read_everything(user) or has_role(user, Role.DEVELOPER)


def record_use_cases_visible(user: AnyUser) -> QuerySet[UseCase]:
    """The use cases a person may filter records by: those whose records they may read."""
    found = UseCase.objects.select_related("tenant").order_by("tenant__slug", "slug")
    if can_read_everything(user):
        return found
    if has_role(user, Role.DEVELOPER):
        return found.filter(
            tenant__members=user,  # type: ignore[misc]
            records_visible_to_developers=True,
        )
    return found.none()


def record_tenants_visible(user: AnyUser) -> QuerySet[Tenant]:
    tenants = Tenant.objects.order_by("slug")
    if can_read_everything(user):
        return tenants
    ids = record_use_cases_visible(user).values_list("tenant_id", flat=True)
    return tenants.filter(pk__in=list(ids))
