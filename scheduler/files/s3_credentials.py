"""S3 credentials: the access key pairs a use case uploads its registered files with.

Issued, rotated and revoked under the rules of API keys (governance/services/api_keys.py):
developers of the use case's tenant and officers, for approved use cases only, every step audited
(``s3credential.issue/rotate/revoke``). Unlike an API key the secret cannot be stored hashed:
verifying AWS Signature V4 (s3endpoint/sigv4.py) needs the secret itself, so it is sealed with
the records keys (records/sealing.py, kept base64 in a text column) and returned in plain
exactly once, in the response that issued it.

Browsers upload through presigned URLs signed with a *derived* per-use-case credential
(``presign_credential``): never stored, only valid for a presigned PUT of a registered file, so
a portal upload needs no credential a person issued, and revoking one does not break the URL a
browser was handed (docs/files.md, "The S3 endpoint").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from governance.audit import Actor, audit_record
from governance.choices import ApiKeyStatus, UseCaseStatus
from governance.errors import Conflict
from governance.models import FileRegistration, S3Credential, UseCase
from governance.roles import AnyUser
from governance.selectors import use_cases_visible
from governance.services.api_keys import key_lifetime_check
from governance.services.authority import require_member
from records.sealing import seal, unseal

ACCESS_KEY_PREFIX = "SYAK"
PRESIGN_KEY_PREFIX = "SYPU"  # derived, never stored: see presign_credential
SECRET_LENGTH = 40
MAX_ROTATION_GRACE = timedelta(days=7)


# --- key material -------------------------------------------------------------------------
def access_key_generate() -> str:
    """``SYAK`` + 16 upper-case base32 characters (80 random bits): AWS's own shape, so tools
    that check the length or alphabet of an access key id accept it."""
    return ACCESS_KEY_PREFIX + base64.b32encode(secrets.token_bytes(10)).decode()


def secret_generate() -> str:
    """40 characters, as AWS's secrets are: 240 random bits, URL-safe (no quoting in env)."""
    return secrets.token_urlsafe(30)


def secret_of(credential: S3Credential) -> str:
    """The plaintext secret, for the endpoint's signature check only (never logged)."""
    return unseal(base64.b64decode(credential.secret_sealed)).decode()


# --- the derived credential for presigned URLs --------------------------------------------
@dataclass(frozen=True, slots=True)
class PresignCredential:
    access_key_id: str
    secret: str
    use_case_id: int


def presign_credential(use_case_id: int) -> PresignCredential:
    """The per-use-case credential presigned URLs are signed with, derived from the server's
    secret: the endpoint recomputes it from the access key id, so nothing is stored, and
    changing ``SWITCHYARD_S3_PRESIGN_SECRET`` (default: the Django secret) voids every URL."""
    master = (settings.S3_PRESIGN_SECRET or settings.SECRET_KEY).encode()
    mac = hmac.new(master, f"switchyard-s3-presign:{use_case_id}".encode(), hashlib.sha256)
    secret = base64.urlsafe_b64encode(mac.digest()).decode()[:SECRET_LENGTH]
    return PresignCredential(
        access_key_id=f"{PRESIGN_KEY_PREFIX}{use_case_id:016d}",
        secret=secret,
        use_case_id=use_case_id,
    )


def presign_use_case_id(access_key_id: str) -> int | None:
    """The use case a derived access key id names, or None if it is not one."""
    digits = access_key_id.removeprefix(PRESIGN_KEY_PREFIX)
    if digits == access_key_id or len(digits) != 16 or not digits.isdigit():
        return None
    return int(digits)


PRESIGNED_PUT_SECONDS = 3600


def virtual_bucket(use_case: UseCase) -> str:
    """``<tenant slug>-<use case slug>``: slugs are lower-case letters, digits and hyphens,
    so this is a valid S3 bucket name whenever it is at most 63 characters long."""
    return f"{use_case.tenant.slug}-{use_case.slug}"


def object_key(file: FileRegistration) -> str:
    return f"{file.pk}/{file.filename}"


def presigned_put_url(file: FileRegistration, *, expires: int = PRESIGNED_PUT_SECONDS) -> str:
    """A URL a browser (or curl) PUTs the file's bytes to, no credential needed, for an hour."""
    derived = presign_credential(file.use_case_id)
    base = settings.S3_ENDPOINT_PUBLIC_URL.rstrip("/")
    key = quote(object_key(file), safe="/-_.~")
    request = AWSRequest(method="PUT", url=f"{base}/{virtual_bucket(file.use_case)}/{key}")
    credentials = Credentials(derived.access_key_id, derived.secret)
    S3SigV4QueryAuth(credentials, "s3", settings.S3_REGION, expires=expires).add_auth(request)
    return str(request.url)


def upload_block(file: FileRegistration) -> dict[str, str]:
    """Where and how to upload a registered file: the ``upload`` of the registration answer."""
    return {
        "endpoint_url": settings.S3_ENDPOINT_PUBLIC_URL,
        "bucket": virtual_bucket(file.use_case),
        "key": object_key(file),
        "presigned_put_url": presigned_put_url(file),
    }


# --- selectors ----------------------------------------------------------------------------
def s3_credentials_visible(user: AnyUser) -> QuerySet[S3Credential]:
    return S3Credential.objects.filter(use_case__in=use_cases_visible(user)).select_related(
        "use_case__tenant"
    )


# --- services -----------------------------------------------------------------------------
def _audit(actor: Actor, credential: S3Credential, action: str, **extra: Any) -> None:
    audit_record(
        actor=actor,
        action=f"s3credential.{action}",
        obj=credential,
        after={"status": credential.status, "access_key_id": credential.access_key_id, **extra},
        tenant_slug=credential.use_case.tenant.slug,
    )


def _create(
    *, actor: Actor, use_case: UseCase, name: str, expires_at: datetime | None, **fields: Any
) -> tuple[S3Credential, str]:
    secret = secret_generate()
    credential = S3Credential.objects.create(
        use_case=use_case,
        name=name,
        access_key_id=access_key_generate(),
        secret_sealed=base64.b64encode(seal(secret.encode())).decode(),
        status=ApiKeyStatus.ACTIVE,
        created_by=actor.username[:150],
        revealed_at=timezone.now(),
        expires_at=expires_at,
        **fields,
    )
    return credential, secret


@transaction.atomic
def s3_credential_issue(
    *, actor: Actor, use_case: UseCase, name: str = "", expires_at: datetime | None = None
) -> tuple[S3Credential, str]:
    """A new active pair for an approved use case; the secret is returned this once."""
    require_member(actor, use_case.tenant)
    if use_case.status != UseCaseStatus.APPROVED:
        raise Conflict(
            f"S3 credentials are issued for approved use cases; this one is {use_case.status}."
        )
    key_lifetime_check(expires_at)
    credential, secret = _create(actor=actor, use_case=use_case, name=name, expires_at=expires_at)
    _audit(actor, credential, "issue", name=name)
    return credential, secret


@transaction.atomic
def s3_credential_rotate(
    *, actor: Actor, credential: S3Credential, grace: timedelta | None = None
) -> tuple[S3Credential, str]:
    """A new pair replaces an active one. Without a grace the old pair is revoked now; with
    one it keeps working until the grace ends (clients switch over without an outage)."""
    require_member(actor, credential.use_case.tenant)
    if grace is not None and not timedelta(0) <= grace <= MAX_ROTATION_GRACE:
        raise ValidationError({"grace_seconds": "Choose a grace period between 0 and 7 days."})
    # Locked: two rotations of one pair must not both hand out a successor.
    old = S3Credential.objects.select_for_update().get(pk=credential.pk)
    if old.status != ApiKeyStatus.ACTIVE:
        raise Conflict(f"Only an active credential can be rotated; this one is {old.status}.")
    if S3Credential.objects.filter(rotated_from=old).exists():
        raise Conflict("This credential was already rotated; rotate its successor instead.")
    successor, secret = _create(
        actor=actor,
        use_case=old.use_case,
        name=old.name,
        expires_at=old.expires_at,
        rotated_from=old,
    )
    now = timezone.now()
    if grace:
        grace_end = now + grace
        if old.expires_at is None or old.expires_at > grace_end:
            old.expires_at = grace_end
            old.save(update_fields=["expires_at"])
    else:
        old.status = ApiKeyStatus.REVOKED
        old.revoked_at = now
        old.save(update_fields=["status", "revoked_at"])
    _audit(
        actor,
        successor,
        "rotate",
        rotated_from=old.access_key_id,
        old_status=old.status,
        old_expires_at=old.expires_at.isoformat() if old.expires_at else None,
    )
    return successor, secret


@transaction.atomic
def s3_credential_revoke(
    *, actor: Actor, credential: S3Credential, reason: str = ""
) -> S3Credential:
    require_member(actor, credential.use_case.tenant)
    revoked = S3Credential.objects.filter(pk=credential.pk, status=ApiKeyStatus.ACTIVE).update(
        status=ApiKeyStatus.REVOKED, revoked_at=timezone.now()
    )
    credential.refresh_from_db()
    if not revoked:
        raise Conflict(f"This credential is already {credential.status}.")
    _audit(actor, credential, "revoke", reason=reason)
    return credential
