"""The navigation bar, by role: each person sees the links to what they can use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django import template
from django.http import HttpRequest
from django.urls import reverse

from governance.roles import Role, can_govern, can_read_everything, has_role, roles_of
from portal.fleet.access import may_watch_fleet
from portal.selectors import can_act, review_queue_size
from records.reading import may_search_records

register = template.Library()


# The top bar holds at most this many links beside the brand and the account; the rest go in
# the "More" menu. Six of the longest labels fit one row at 1280 px (tests/browser/
# test_nav_layout.py); a person with several roles gets the first six by each role's order.
MAX_PRIMARY = 6


@dataclass(frozen=True)
class NavItem:
    label: str
    url: str
    current: bool
    badge: int | None = None


@dataclass(frozen=True)
class Nav:
    items: list[NavItem]  # shown in the bar
    more: list[NavItem]  # in the "More" menu (a <details>: keyboard-operable without script)
    roles: list[str]
    read_only: bool

    @property
    def more_current(self) -> bool:
        return any(item.current for item in self.more)

    @property
    def more_badge(self) -> int | None:
        badges = [item.badge for item in self.more if item.badge]
        return sum(badges) if badges else None


# (label, url, badge, primary): ``primary`` is whether the link earns a place in the bar for
# this person, i.e. it is what their role comes to the portal for.
_Wanted = tuple[str, str, int | None, bool]


def _wanted(user: Any) -> list[_Wanted]:
    """Every link the person may use, in the bar's order, with whether it is primary."""
    developer_only = has_role(user, Role.DEVELOPER) and not can_read_everything(user)
    governs = can_govern(user)
    wanted: list[_Wanted] = []
    if developer_only:
        wanted.append(("My use cases & keys", reverse("portal:dashboard"), None, True))
        wanted.append(("Request a use case", reverse("portal:use_case_request"), None, True))
    elif can_read_everything(user):
        wanted.append(("Use cases & keys", reverse("portal:dashboard"), None, True))
        badge = review_queue_size() if governs else None
        wanted.append(("Review queue", reverse("portal:review"), badge, governs))
        if governs:
            wanted.append(("Governance", reverse("portal:governance"), None, True))
    if has_role(user, Role.DEVELOPER):
        wanted.append(("My usage", reverse("portal:my_usage"), None, True))
        wanted.append(("My work", reverse("portal:my_work"), None, True))
    if roles_of(user):
        # Anyone with a role (the API's rule): developers see their own tenants' decisions.
        wanted.append(("Admission decisions", reverse("portal:admission_decisions"), None, False))
        # Auditors come for files (listen, download); officers find them in the menu.
        files_primary = (not governs and has_role(user, Role.AUDITOR)) or developer_only
        wanted.append(("Files", reverse("portal:files"), None, files_primary))
        if not has_role(user, Role.DEVELOPER):
            wanted.append(("Tasks & files", reverse("portal:my_work"), None, False))
    if can_read_everything(user):
        wanted.append(("Guardrail findings", reverse("portal:guardrail_findings"), None, False))
    if may_search_records(user):
        records_primary = has_role(user, Role.AUDITOR) and not governs
        wanted.append(("Records", reverse("portal:records"), None, records_primary))
    if can_read_everything(user):
        wanted.append(("Dead letters", reverse("portal:async_dead_letters"), None, False))
        wanted.append(("Audit trail", reverse("portal:audit_trail"), None, True))
    if may_watch_fleet(user):
        wanted.append(("Live fleet", reverse("portal:fleet"), None, True))
    if getattr(user, "is_staff", False):
        wanted.append(("Admin", reverse("admin:index"), None, False))
    return wanted


@register.simple_tag(takes_context=True)
def portal_nav(context: template.Context) -> Nav:
    request: HttpRequest | None = context.get("request")
    if request is None or not request.user.is_authenticated:
        return Nav(items=[], more=[], roles=[], read_only=False)
    user = request.user
    items: list[NavItem] = []
    more: list[NavItem] = []
    for label, url, badge, primary in _wanted(user):
        item = NavItem(label, url, current=request.path.startswith(url), badge=badge)
        (items if primary and len(items) < MAX_PRIMARY else more).append(item)
    return Nav(
        items=items,
        more=more,
        roles=sorted(str(role) for role in roles_of(user)),
        read_only=not can_act(user),
    )
