"""Who may watch the fleet: the people who read everything (officers, admins, auditors).

The view names no tenant's data (models, replicas, classes, rates), but it is the platform's
operating picture: developers see their own use cases' usage elsewhere."""

from __future__ import annotations

from governance.roles import AnyUser, can_read_everything


def may_watch_fleet(user: AnyUser) -> bool:
    return can_read_everything(user)
