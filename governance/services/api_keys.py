"""API keys: requested by a developer, decided by another officer, revealed once to the
requester, rotated with a grace period, revoked by anyone on the tenant.

The secret is generated when the key is first revealed and only its hash is kept; every step
is audited, and each one the gateway must see (reveal, rotate, revoke, issue) republishes.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from governance.audit import Actor, audit_record
from governance.choices import ApiKeyStatus, UseCaseStatus
from governance.errors import Conflict
from governance.keys import key_generate, key_hash, key_visible_prefix
from governance.models import ApiKey, UseCase
from governance.services.authority import (
    acting_person,
    require_governor,
    require_member,
    same_person,
)
from governance.services.republish import policy_changed


def key_lifetime_check(expires_at: datetime | None) -> None:
    """An expiry in the future and within the longest lifetime; S3 credentials keep it too."""
    now = timezone.now()
    if expires_at is None:
        return
    if expires_at <= now:
        raise ValidationError({"expires_at": "Choose a time in the future."})
    longest = timedelta(days=settings.API_KEY_MAX_LIFETIME_DAYS)
    if expires_at - now > longest:
        raise ValidationError(
            {"expires_at": f"Keys live at most {settings.API_KEY_MAX_LIFETIME_DAYS} days."}
        )


def _require_owner(actor: Actor, key: ApiKey, verb: str) -> None:
    """Only the key's requester receives its secret (reveal, rotate): not a teammate, not an
    officer, not the platform."""
    user = acting_person(actor)
    if user is None or key.requested_by_id != user.pk:
        raise PermissionDenied(f"Only the person who requested this key can {verb} it.")


def _audit_key(actor: Actor, key: ApiKey, action: str, **extra: Any) -> None:
    audit_record(
        actor=actor,
        action=f"apikey.{action}",
        obj=key,
        after={"status": key.status, "prefix": key.prefix, **extra},
        tenant_slug=key.use_case.tenant.slug,
    )


@transaction.atomic
def api_key_request(
    *,
    actor: Actor,
    use_case: UseCase,
    name: str,
    reason: str,
    expires_at: datetime | None = None,
) -> ApiKey:
    """A developer asks for a key for one of their tenant's approved use cases."""
    require_member(actor, use_case.tenant)
    if use_case.status != UseCaseStatus.APPROVED:
        raise Conflict(f"Keys are issued for approved use cases; this one is {use_case.status}.")
    if not reason.strip():
        raise ValidationError({"reason": "Say what the key is for."})
    key_lifetime_check(expires_at)
    key = ApiKey(
        use_case=use_case,
        name=name,
        reason=reason,
        expires_at=expires_at,
        requested_by=cast(Any, actor.user),
        status=ApiKeyStatus.PENDING,
    )
    key.full_clean()
    key.save()
    _audit_key(actor, key, "request", reason=reason)
    return key


@transaction.atomic
def api_key_decide(*, actor: Actor, key: ApiKey, approve: bool, reason: str = "") -> ApiKey:
    """An officer approves or rejects a pending key request; never their own."""
    require_governor(actor)
    if approve and same_person(actor, key.requested_by):
        raise PermissionDenied(
            "You requested this key; another officer must approve it. "
            "No one approves their own request."
        )
    if not approve and not reason.strip():
        raise ValidationError({"reason": "Say why the request is rejected."})
    target = ApiKeyStatus.APPROVED if approve else ApiKeyStatus.REJECTED
    decided = ApiKey.objects.filter(pk=key.pk, status=ApiKeyStatus.PENDING).update(
        status=target, decided_by=actor.user, decided_at=timezone.now(), decision_reason=reason
    )
    if not decided:
        key.refresh_from_db()
        raise Conflict(f"This key request was already decided ({key.status}).")
    key.refresh_from_db()
    _audit_key(actor, key, "approve" if approve else "reject", reason=reason)
    return key


def _activate(key_id: int, *, from_status: str) -> str | None:
    """Generate the secret and activate the key, once; returns the plaintext or None."""
    plaintext = key_generate()
    activated = ApiKey.objects.filter(
        pk=key_id, status=from_status, revealed_at__isnull=True
    ).update(
        status=ApiKeyStatus.ACTIVE,
        key_hash=key_hash(plaintext),
        prefix=key_visible_prefix(plaintext),
        revealed_at=timezone.now(),
    )
    return plaintext if activated else None


@transaction.atomic
def api_key_reveal(*, actor: Actor, key: ApiKey) -> tuple[ApiKey, str]:
    """Show an approved key's secret to its requester — exactly once, ever."""
    _require_owner(actor, key, "reveal")
    plaintext = _activate(key.pk, from_status=ApiKeyStatus.APPROVED)
    if plaintext is None:
        key.refresh_from_db()
        if key.revealed_at is not None:
            raise Conflict(
                "This key was already revealed; it cannot be shown again. Rotate it instead."
            )
        raise Conflict(f"Only an approved key can be revealed; this one is {key.status}.")
    key.refresh_from_db()
    _audit_key(actor, key, "reveal")
    policy_changed()
    return key, plaintext


@transaction.atomic
def api_key_rotate(
    *, actor: Actor, key: ApiKey, grace: timedelta | None = None
) -> tuple[ApiKey, str]:
    """Replace an active key: the new one works now, the old one until the grace ends.

    Only the key's owner rotates it, since rotating hands out the new secret: a teammate or
    an officer who must stop a key revokes it instead.
    """
    require_member(actor, key.use_case.tenant)
    _require_owner(actor, key, "rotate")
    grace = timedelta(seconds=settings.API_KEY_ROTATION_GRACE_SECONDS) if grace is None else grace
    if grace < timedelta(0) or grace > timedelta(days=7):
        raise ValidationError({"grace": "Choose a grace period between 0 and 7 days."})
    if key.status != ApiKeyStatus.ACTIVE:
        raise Conflict(f"Only an active key can be rotated; this one is {key.status}.")
    if ApiKey.objects.filter(rotated_from=key).exists():
        raise Conflict("This key was already rotated; rotate its successor instead.")
    successor = ApiKey.objects.create(
        use_case=key.use_case,
        name=key.name,
        reason=f"rotation of {key.prefix}",
        requested_by=key.requested_by,
        status=ApiKeyStatus.APPROVED,
        decided_by=key.decided_by,
        decided_at=key.decided_at,
        decision_reason="approved as the rotation of an approved key",
        expires_at=key.expires_at,
        rotated_from=key,
    )
    plaintext = _activate(successor.pk, from_status=ApiKeyStatus.APPROVED)
    assert plaintext is not None  # the row was created above, in this transaction
    successor.refresh_from_db()
    grace_end = timezone.now() + grace
    if key.expires_at is None or key.expires_at > grace_end:
        key.expires_at = grace_end
        key.save(update_fields=["expires_at"])
    _audit_key(
        actor,
        successor,
        "rotate",
        rotated_from=key.prefix,
        old_key_expires_at=grace_end.isoformat(),
    )
    policy_changed()
    return successor, plaintext


@transaction.atomic
def api_key_revoke(*, actor: Actor, key: ApiKey, reason: str = "") -> ApiKey:
    require_member(actor, key.use_case.tenant)
    revocable = (ApiKeyStatus.PENDING, ApiKeyStatus.APPROVED, ApiKeyStatus.ACTIVE)
    revoked = ApiKey.objects.filter(pk=key.pk, status__in=revocable).update(
        status=ApiKeyStatus.REVOKED
    )
    if not revoked:
        key.refresh_from_db()
        raise Conflict(f"This key is already {key.status}.")
    key.refresh_from_db()
    _audit_key(actor, key, "revoke", reason=reason)
    policy_changed()
    return key


@transaction.atomic
def api_key_issue(
    *, actor: Actor, use_case: UseCase, name: str, expires_at: datetime | None = None
) -> tuple[ApiKey, str]:
    """Mint an active key directly, for the platform itself (demo seed, policy-as-code)."""
    if not actor.is_system:
        raise PermissionDenied("People request keys; only the platform mints them directly.")
    key_lifetime_check(expires_at)
    key = ApiKey.objects.create(
        use_case=use_case,
        name=name,
        reason="minted by the platform",
        status=ApiKeyStatus.APPROVED,
        decided_at=timezone.now(),
        decision_reason=f"minted by {actor.username}",
        expires_at=expires_at,
    )
    plaintext = _activate(key.pk, from_status=ApiKeyStatus.APPROVED)
    assert plaintext is not None
    key.refresh_from_db()
    _audit_key(actor, key, "issue")
    policy_changed()
    return key, plaintext
