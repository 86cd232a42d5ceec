"""Roles (officer, developer, auditor, admin) and which tenants a person may see.

Roles are Django groups named ``switchyard:<role>``, set from Keycloak claims at each SSO
login (or by an admin for local accounts); superusers are admins.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group
from django.db.models import QuerySet

from governance.models import Tenant

GROUP_PREFIX = "switchyard:"


class Role(StrEnum):
    OFFICER = "officer"  # governs: registers, approves, suspends
    DEVELOPER = "developer"  # works on their tenants' use cases and keys
    AUDITOR = "auditor"  # reads everything, changes nothing
    ADMIN = "admin"  # everything, including the platform's own settings


AnyUser = AbstractBaseUser | AnonymousUser


def roles_of(user: AnyUser) -> frozenset[Role]:
    if not user.is_authenticated:
        return frozenset()
    cached: frozenset[Role] | None = getattr(user, "_switchyard_roles", None)
    if cached is not None:
        return cached
    person: Any = user  # a concrete user model: it has groups
    names = person.groups.values_list("name", flat=True)
    roles = {Role(n.removeprefix(GROUP_PREFIX)) for n in names if _is_role_group(n)}
    if getattr(user, "is_superuser", False):
        roles.add(Role.ADMIN)
    result = frozenset(roles)
    person._switchyard_roles = result  # memoised for the request that holds this user
    return result


def _is_role_group(name: str) -> bool:
    return name.startswith(GROUP_PREFIX) and name.removeprefix(GROUP_PREFIX) in set(Role)


def roles_set(user: AbstractBaseUser, roles: Iterable[Role]) -> None:
    """Make the user's role groups exactly ``roles`` (other groups are left alone)."""
    wanted = {Group.objects.get_or_create(name=GROUP_PREFIX + role)[0] for role in roles}
    current = set(user.groups.filter(name__startswith=GROUP_PREFIX))  # type: ignore[attr-defined]
    user.groups.remove(*(current - wanted))  # type: ignore[attr-defined]
    user.groups.add(*(wanted - current))  # type: ignore[attr-defined]
    if hasattr(user, "_switchyard_roles"):
        del user._switchyard_roles


def has_role(user: AnyUser, *roles: Role) -> bool:
    return bool(roles_of(user) & set(roles))


def can_govern(user: AnyUser) -> bool:
    return has_role(user, Role.OFFICER, Role.ADMIN)


def can_read_everything(user: AnyUser) -> bool:
    return has_role(user, Role.OFFICER, Role.AUDITOR, Role.ADMIN)


def visible_tenants(user: AnyUser) -> QuerySet[Tenant]:
    if can_read_everything(user):
        return Tenant.objects.all()
    if has_role(user, Role.DEVELOPER):
        return Tenant.objects.filter(members=user)  # type: ignore[misc]
    return Tenant.objects.none()
