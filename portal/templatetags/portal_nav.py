"""The navigation bar, by role: each person sees the links to what they can use."""

from __future__ import annotations

from dataclasses import dataclass

from django import template
from django.http import HttpRequest
from django.urls import reverse

from governance.roles import Role, can_govern, can_read_everything, has_role, roles_of
from portal.fleet.access import may_watch_fleet
from portal.selectors import can_act, review_queue_size
from scheduler.record_reading import may_search_records

register = template.Library()


@dataclass(frozen=True)
class NavItem:
    label: str
    url: str
    current: bool
    badge: int | None = None


@dataclass(frozen=True)
class Nav:
    items: list[NavItem]
    roles: list[str]
    read_only: bool


@register.simple_tag(takes_context=True)
def portal_nav(context: template.Context) -> Nav:
    request: HttpRequest | None = context.get("request")
    if request is None or not request.user.is_authenticated:
        return Nav(items=[], roles=[], read_only=False)
    user = request.user
    wanted: list[tuple[str, str, int | None]] = []
    if has_role(user, Role.DEVELOPER) and not can_read_everything(user):
        wanted.append(("My use cases & keys", reverse("portal:dashboard"), None))
        wanted.append(("Request a use case", reverse("portal:use_case_request"), None))
    elif can_read_everything(user):
        wanted.append(("Use cases & keys", reverse("portal:dashboard"), None))
        badge = review_queue_size() if can_govern(user) else None
        wanted.append(("Review queue", reverse("portal:review"), badge))
        if can_govern(user):
            wanted.append(("Governance", reverse("portal:governance"), None))
    if has_role(user, Role.DEVELOPER):
        wanted.append(("My usage", reverse("portal:my_usage"), None))
    if roles_of(user):
        # Anyone with a role (the API's rule): developers see their own tenants' decisions.
        wanted.append(("Admission decisions", reverse("portal:admission_decisions"), None))
    if roles_of(user):
        wanted.append(("Files", reverse("portal:files"), None))
    if can_read_everything(user):
        wanted.append(("Guardrail findings", reverse("portal:guardrail_findings"), None))
    if may_search_records(user):
        wanted.append(("Records", reverse("portal:records"), None))
    if can_read_everything(user):
        wanted.append(("Dead letters", reverse("portal:async_dead_letters"), None))
        wanted.append(("Audit trail", reverse("portal:audit_trail"), None))
    if may_watch_fleet(user):
        wanted.append(("Live fleet", reverse("portal:fleet"), None))
    if getattr(user, "is_staff", False):
        wanted.append(("Admin", reverse("admin:index"), None))
    items = [
        NavItem(label, url, current=request.path.startswith(url), badge=badge)
        for label, url, badge in wanted
    ]
    return Nav(
        items=items,
        roles=sorted(str(role) for role in roles_of(user)),
        read_only=not can_act(user),
    )
