"""Identities from an OpenID Connect provider (Keycloak): claims to roles and tenants, and the
one place a person's or service account's Switchyard access is synced from them.

Used by the portal's SSO login and by the API's service-account authentication alike.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import IntegrityError, transaction

from governance.audit import Actor, audit_record
from governance.models import Tenant
from governance.roles import Role, roles_of, roles_set

logger = logging.getLogger(__name__)


# --- claims → roles and tenants (pure) --------------------------------------------------------
def claim_values(claims: Mapping[str, Any], path: str) -> list[str]:
    """The strings at a dotted path (``realm_access.roles``); a lone string counts as one."""
    node: Any = claims
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return []
        node = node.get(part)
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [value for value in node if isinstance(value, str)]
    return []


def roles_from_claims(
    claims: Mapping[str, Any], *, claim: str, role_map: Mapping[str, str]
) -> frozenset[Role]:
    return frozenset(
        Role(role_map[value]) for value in claim_values(claims, claim) if value in role_map
    )


def tenant_slugs_from_claims(
    claims: Mapping[str, Any], *, claim: str, prefix: str
) -> frozenset[str]:
    """``/tenants/acme`` (or ``tenant:acme`` with that prefix) → ``acme``; subgroups count too."""
    if not prefix:
        return frozenset()
    slugs = set()
    for group in claim_values(claims, claim):
        if group.startswith(prefix):
            slug = group.removeprefix(prefix).split("/", 1)[0]
            if slug:
                slugs.add(slug)
    return frozenset(slugs)


@dataclass(frozen=True)
class Identity:
    """What the identity provider says about a person or a service account."""

    username: str
    email: str = ""
    first_name: str = ""
    last_name: str = ""
    roles: frozenset[Role] = frozenset()
    tenant_slugs: frozenset[str] = frozenset()


def identity_from_claims(claims: Mapping[str, Any], *, username: str) -> Identity:
    def text(name: str, limit: int) -> str:
        value = claims.get(name)
        return value[:limit] if isinstance(value, str) else ""

    return Identity(
        username=username,
        email=text("email", 254),
        first_name=text("given_name", 150),
        last_name=text("family_name", 150),
        roles=roles_from_claims(
            claims, claim=settings.SSO_ROLE_CLAIM, role_map=settings.SSO_ROLE_MAP
        ),
        tenant_slugs=tenant_slugs_from_claims(
            claims, claim=settings.SSO_GROUPS_CLAIM, prefix=settings.SSO_TENANT_GROUP_PREFIX
        ),
    )


# --- identity → Django user -------------------------------------------------------------------
class SSORefused(Exception):
    """The identity provider vouched for someone Switchyard will not let in; says why."""


@dataclass(frozen=True)
class Access:
    roles: list[str]
    tenants: list[str]

    def as_dict(self) -> dict[str, list[str]]:
        return {"roles": self.roles, "tenants": self.tenants}


def _access_of(user: AbstractBaseUser) -> Access:
    roles = sorted(str(role) for role in roles_of(user))
    tenants = sorted(Tenant.objects.filter(members=user).values_list("slug", flat=True))  # type: ignore[misc]
    return Access(roles=roles, tenants=tenants)


def _actor(user_or_name: AbstractBaseUser | str, origin: Actor) -> Actor:
    if isinstance(user_or_name, str):
        return Actor(
            username=user_or_name, request_id=origin.request_id, source_ip=origin.source_ip
        )
    return Actor.for_user(user_or_name, request_id=origin.request_id, source_ip=origin.source_ip)


def _grant(user: AbstractBaseUser, roles: frozenset[Role], tenant_slugs: frozenset[str]) -> None:
    roles_set(user, roles)
    wanted = set(Tenant.objects.filter(slug__in=tenant_slugs))  # unknown tenants are ignored
    current = set(Tenant.objects.filter(members=user))  # type: ignore[misc]
    for tenant in wanted - current:
        tenant.members.add(user)  # type: ignore[arg-type]
    for tenant in current - wanted:
        tenant.members.remove(user)  # type: ignore[arg-type]
    # The admin role is Django's superuser too, so that taking it away at the IdP takes
    # away everything it gave (roles_of counts superusers as admins).
    is_admin = Role.ADMIN in roles
    if (
        getattr(user, "is_superuser", None) != is_admin
        or getattr(user, "is_staff", None) != is_admin
    ):
        user.is_superuser = user.is_staff = is_admin  # type: ignore[attr-defined]
        user.save(update_fields=["is_superuser", "is_staff"])
    if hasattr(user, "_switchyard_roles"):
        del user._switchyard_roles


def sso_user_sync(
    *, identity: Identity, origin: Actor, audit_refusals: bool = True
) -> AbstractBaseUser:
    """Create or update the user the identity provider vouched for; raise SSORefused if barred.

    Roles and tenant memberships become exactly what the claims say. A user with none of the
    Switchyard roles is refused (and loses any roles held here). An existing local account
    with a password is never taken over by an SSO identity of the same name. Nothing is
    written when nothing changed, so the API can call this on every request.
    """
    try:
        return _sync(identity, origin, audit_refusals)
    except IntegrityError:
        # Two first requests of the same new account raced to create it: the loser retries
        # and finds the winner's row.
        return _sync(identity, origin, audit_refusals)


def _sync(identity: Identity, origin: Actor, audit_refusals: bool) -> AbstractBaseUser:
    refusal: tuple[str, str] | None = None
    with transaction.atomic():
        user_model = get_user_model()
        user = user_model.objects.select_for_update().filter(username=identity.username).first()
        if user is not None and user.has_usable_password():
            refusal = (
                "local account with this username",
                f"A local account named “{identity.username}” already exists here, so single "
                "sign-on cannot use it. Ask an administrator to rename it or remove its password.",
            )
        elif user is not None and not user.is_active:
            refusal = (
                "account disabled",
                f"The account “{identity.username}” is disabled in Switchyard.",
            )
        elif not identity.roles:
            refusal = (
                "no Switchyard role",
                f"The account “{identity.username}” has none of the Switchyard roles "
                f"({', '.join(Role)}). Ask your identity administrator for one.",
            )
            if user is not None:
                _grant_and_record(user, origin, frozenset(), frozenset())
        else:
            if user is None:
                user = user_model(username=identity.username)
                user.set_unusable_password()
            profile = {
                "email": identity.email,
                "first_name": identity.first_name,
                "last_name": identity.last_name,
            }
            if user.pk is None or any(getattr(user, f) != v for f, v in profile.items()):
                for field, value in profile.items():
                    setattr(user, field, value)
                user.save()
            _grant_and_record(user, origin, identity.roles, identity.tenant_slugs)
        if refusal is not None and audit_refusals:
            audit_record(
                actor=_actor(
                    user
                    if user is not None and not user.has_usable_password()
                    else identity.username,
                    origin,
                ),
                action="user.login_sso_refused",
                obj=user,
                object_repr=identity.username,
                after={"reason": refusal[0]},
            )
    if refusal is not None:
        raise SSORefused(refusal[1])
    assert user is not None
    return user


def _grant_and_record(
    user: AbstractBaseUser, origin: Actor, roles: frozenset[Role], tenant_slugs: frozenset[str]
) -> None:
    before = _access_of(user)
    _grant(user, roles, tenant_slugs)
    after = _access_of(user)
    if before != after:
        audit_record(
            actor=_actor(user, origin),
            action="user.roles_changed",
            obj=user,
            before=before.as_dict(),
            after=after.as_dict(),
        )


def sso_access(user: AbstractBaseUser) -> dict[str, list[str]]:
    return _access_of(user).as_dict()


# --- the views around mozilla-django-oidc ------------------------------------------------------
