"""The append-only, hash-chained audit trail: record events, verify the chain.

Each event's hash is SHA-256 over a canonical JSON of its fields plus the previous event's
hash. Appends take a row lock on the chain head so concurrent writers (several web processes,
workers) form one unbroken chain on PostgreSQL as on SQLite.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.db.models import Model as DjangoModel
from django.forms.models import model_to_dict
from django.http import HttpRequest
from django.utils import timezone

from governance.anchors import UnreadableCheckpoint, checkpoints_read
from governance.models import AuditChainHead, AuditEvent, Tenant

GENESIS_HASH = "0" * 64
# Fields that never enter the audit trail: a key's hash is not the key, but there is no need
# for it to be copied anywhere beyond the table that must hold it.
_REDACTED_FIELDS = {"key_hash", "password"}


@dataclass(frozen=True)
class Actor:
    """Who did it, and from where: bound once per request or job, passed to every service."""

    username: str
    request_id: str = ""
    source_ip: str | None = None
    # The person behind the action, whose roles and tenants the services check.
    user: AbstractBaseUser | None = field(default=None, compare=False)
    # The platform itself (seeding, policy-as-code applied by an operator, Celery jobs): the
    # only actor that skips role checks. Explicit, so that an actor with no user and no flag
    # (an anonymous request) is refused everything rather than taken for the platform.
    is_system: bool = False

    @classmethod
    def system(cls, what: str) -> Actor:
        return cls(username=f"system:{what}", is_system=True)

    @classmethod
    def for_user(
        cls, user: AbstractBaseUser, *, request_id: str = "", source_ip: str | None = None
    ) -> Actor:
        return cls(
            username=user.get_username(), request_id=request_id, source_ip=source_ip, user=user
        )

    @classmethod
    def from_request(cls, request: HttpRequest) -> Actor:
        user = getattr(request, "user", None)
        username = (
            user.get_username() if user is not None and user.is_authenticated else "anonymous"
        )
        return cls(
            username=username,
            request_id=request.headers.get("X-Request-Id", "")[:128],
            source_ip=_client_ip(request),
            user=user if user is not None and user.is_authenticated else None,
        )


def _client_ip(request: HttpRequest) -> str | None:
    """The address the outermost of our own proxies saw. Each proxy appends its peer to
    X-Forwarded-For, so with N trusted hops the Nth entry from the right is the client and
    anything left of it is the client's own writing; with none, the peer is the client."""
    hops: int = settings.TRUSTED_PROXY_HOPS
    candidate = request.META.get("REMOTE_ADDR", "")
    if hops:
        forwarded = [
            part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
        ]
        forwarded = [part for part in forwarded if part]
        if len(forwarded) >= hops:
            candidate = forwarded[-hops]
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        return None


def object_state(obj: DjangoModel) -> dict[str, Any]:
    """A JSON-safe picture of a row, for before/after: every field but redacted ones."""
    data = model_to_dict(obj)
    data["id"] = obj.pk
    state = {k: _jsonable(v) for k, v in data.items() if k not in _REDACTED_FIELDS}
    return dict(sorted(state.items()))


def _jsonable(value: Any) -> Any:
    if isinstance(value, DjangoModel):
        return value.pk
    if (
        isinstance(value, list | tuple | set)
        and value
        and isinstance(next(iter(value)), DjangoModel)
    ):
        return sorted(v.pk for v in value)
    if isinstance(value, datetime):
        return value.isoformat()
    return orjson.loads(orjson.dumps(value, default=str))


HASH_VERSION = 2  # the hash covers tenant_id (events before it have hash_version null)


def _canonical(event: AuditEvent) -> bytes:
    fields: dict[str, Any] = {
        "sequence": event.sequence,
        "occurred_at": event.occurred_at.isoformat(),
        "actor": event.actor,
        "action": event.action,
        "object_type": event.object_type,
        "object_id": event.object_id,
        "object_repr": event.object_repr,
        "tenant_slug": event.tenant_slug,
        "before": event.before,
        "after": event.after,
        "request_id": event.request_id,
        "source_ip": event.source_ip,
        "prev_hash": event.prev_hash,
    }
    if event.hash_version is not None:
        fields["hash_version"] = event.hash_version
        fields["tenant_id"] = event.tenant_id
    return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)


def event_hash(event: AuditEvent) -> str:
    return hashlib.sha256(_canonical(event)).hexdigest()


@transaction.atomic
def audit_record(
    *,
    actor: Actor,
    action: str,
    obj: DjangoModel | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    tenant_slug: str = "",
    tenant_id: int | None = None,
    object_repr: str | None = None,
) -> AuditEvent:
    """Append one event. History is keyed by the tenant's id (a slug can be renamed and then
    reused): given, or taken from the object, or from the slug as it stands right now."""
    if tenant_id is None and tenant_slug:
        tenant_id = _tenant_id_of(obj, tenant_slug)
    head, _ = AuditChainHead.objects.select_for_update().get_or_create(
        id=1, defaults={"last_sequence": 0, "last_hash": GENESIS_HASH}
    )
    event = AuditEvent(
        sequence=head.last_sequence + 1,
        occurred_at=timezone.now(),
        actor=actor.username[:150],
        action=action,
        object_type=obj._meta.label_lower if obj is not None else "",
        object_id=str(obj.pk) if obj is not None else "",
        object_repr=(
            object_repr if object_repr is not None else str(obj) if obj is not None else ""
        )[:200],
        tenant_id=tenant_id,
        tenant_slug=tenant_slug,
        before=_jsonable(before) if before is not None else None,
        after=_jsonable(after) if after is not None else None,
        request_id=actor.request_id,
        source_ip=actor.source_ip,
        prev_hash=head.last_hash,
        hash_version=HASH_VERSION,
    )
    event.hash = event_hash(event)
    event.save()
    head.last_sequence = event.sequence
    head.last_hash = event.hash
    head.save(update_fields=["last_sequence", "last_hash"])
    return event


def _tenant_id_of(obj: DjangoModel | None, tenant_slug: str) -> int | None:
    if isinstance(obj, Tenant) and obj.pk is not None:
        return int(obj.pk)
    owner = getattr(obj, "tenant_id", None)
    if isinstance(owner, int):
        return owner
    owner = getattr(getattr(obj, "use_case", None), "tenant_id", None)
    if isinstance(owner, int):
        return owner
    return Tenant.objects.filter(slug=tenant_slug).values_list("pk", flat=True).first()


@dataclass(frozen=True)
class ChainReport:
    ok: bool
    events_checked: int
    first_broken_sequence: int | None = None
    problem: str = ""
    checkpoints_checked: int = 0


def audit_verify() -> ChainReport:
    """Walk the chain in order; report the first event whose link or content is wrong, or
    that disagrees with a signed checkpoint written outside the database (the only thing a
    rewrite that recomputes every hash cannot also rewrite)."""
    try:
        checkpoints = checkpoints_read()
    except UnreadableCheckpoint as exc:
        return ChainReport(False, 0, None, str(exc))
    for checkpoint in checkpoints:
        if not checkpoint.signed_correctly():
            return ChainReport(
                False,
                0,
                checkpoint.sequence,
                f"checkpoint {checkpoint.name} has a signature the anchor key did not make",
            )
    anchored = {c.sequence: c for c in checkpoints}
    expected_prev = GENESIS_HASH
    expected_sequence = 1
    checked = 0
    for event in AuditEvent.objects.order_by("sequence").iterator(chunk_size=2000):
        if event.sequence != expected_sequence:
            return ChainReport(
                False, checked, expected_sequence, f"event #{expected_sequence} is missing"
            )
        if event.prev_hash != expected_prev:
            return ChainReport(
                False, checked, event.sequence, "its link to the previous event is broken"
            )
        if event_hash(event) != event.hash:
            return ChainReport(
                False, checked, event.sequence, "its content does not match its hash"
            )
        anchor = anchored.get(event.sequence)
        if anchor is not None and not hmac.compare_digest(anchor.hash, event.hash):
            return ChainReport(
                False,
                checked,
                event.sequence,
                f"its hash differs from signed checkpoint {anchor.name}: "
                "the chain up to here was rewritten",
            )
        expected_prev = event.hash
        expected_sequence += 1
        checked += 1
    head = AuditChainHead.objects.filter(id=1).first()
    if head is None and checked:
        return ChainReport(False, checked, 1, "the chain's head record is missing")
    if head is not None and head.last_sequence != checked:
        return ChainReport(
            False,
            checked,
            checked + 1,
            f"the chain ends at #{checked} but its head says #{head.last_sequence}",
        )
    beyond = [c for c in checkpoints if c.sequence > checked]
    if beyond:
        return ChainReport(
            False,
            checked,
            checked + 1,
            f"the chain ends at #{checked} but signed checkpoint {beyond[0].name} "
            f"vouches for #{beyond[0].sequence}: events were removed",
        )
    return ChainReport(True, checked, checkpoints_checked=len(checkpoints))
