"""Who may act: the platform, officers and admins decide; developers act on their own tenants.

Every service asks here first, and so do the files domain's (uploads, S3 credentials, webhook
settings): one answer to "may this actor do this?" whatever the door.
"""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied

from governance.audit import Actor
from governance.models import Tenant
from governance.roles import Role, can_govern, has_role


def acting_person(actor: Actor) -> AbstractBaseUser | None:
    """The person to check, or None for the platform; anyone else is refused (fail closed).

    Only an explicitly system actor (``Actor.system``, an operator's command) skips the role
    checks: an actor with no user and no flag, such as an anonymous request, is nobody.
    """
    if actor.is_system:
        return None
    if actor.user is None or not actor.user.is_authenticated:
        raise PermissionDenied("Sign in first.")
    return actor.user


def governs(actor: Actor) -> bool:
    """The platform, an officer or an admin: those who decide rather than ask."""
    user = acting_person(actor)
    return user is None or can_govern(user)


def require_governor(actor: Actor) -> None:
    if not governs(actor):
        raise PermissionDenied("Only a governance officer or an admin may do this.")


def require_member(actor: Actor, tenant: Tenant) -> None:
    """Developers act on their own tenants only; officers and admins on any."""
    user = acting_person(actor)
    if user is None or can_govern(user):
        return
    if has_role(user, Role.DEVELOPER) and tenant.members.filter(pk=user.pk).exists():
        return
    raise PermissionDenied(f"You are not a member of tenant '{tenant.slug}'.")


def same_person(actor: Actor, requester: AbstractBaseUser | None) -> bool:
    """Whether the actor is who asked: the same account, or an operator acting under its name
    (``policy apply --actor olivia``), so that no door lets a person approve their own ask."""
    if requester is None:
        return False
    if actor.user is not None and actor.user.pk == requester.pk:
        return True
    return actor.username == requester.get_username()
