"""Who may watch the fleet: the people who read everything (officers, admins, auditors).

The view names no tenant's data (models, replicas, classes, rates), but it is the platform's
operating picture: developers see their own use cases' usage elsewhere."""

from __future__ import annotations

from importlib import import_module
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user

from governance.roles import AnyUser, can_read_everything


def may_watch_fleet(user: AnyUser) -> bool:
    return can_read_everything(user)


def session_may_watch_fleet(session_key: str | None) -> bool:
    """The check again, from the session as stored now: a websocket lives for hours, and
    signing out, a revoked role or a changed password must end it too."""
    if not session_key:
        return False
    engine: Any = import_module(settings.SESSION_ENGINE)
    # django.contrib.auth.get_user reads only ``request.session`` (and checks the session's
    # hash of the password, as a page request does).
    user = get_user(SimpleNamespace(session=engine.SessionStore(session_key)))  # type: ignore[arg-type]
    return may_watch_fleet(user)
