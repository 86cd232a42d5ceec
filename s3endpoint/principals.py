"""Who signed: the credential behind an access key id, looked up through a small TTL cache.

The ORM runs in asgiref's worker thread (Channels' ``database_sync_to_async``: asgiref's
``sync_to_async`` that also drops stale database connections), never on the event loop. A found
credential is trusted for ``S3_CREDENTIAL_CACHE_SECONDS``: a revocation takes effect within
that time. Unknown ids are not cached, so a pair issued a moment ago works at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from channels.db import database_sync_to_async
from django.utils import timezone

from governance.choices import ApiKeyStatus, UseCaseStatus
from governance.models import S3Credential, UseCase
from s3endpoint.errors import S3Error
from scheduler.files.s3_credentials import presign_credential, presign_use_case_id, secret_of


@dataclass(frozen=True, slots=True)
class Principal:
    access_key_id: str
    secret: str
    use_case_id: int
    tenant_slug: str
    use_case_slug: str
    credential_id: int | None  # None: the derived presign credential
    refusal: str = ""  # non-empty: the credential exists but may not be used (revoked, …)

    @property
    def bucket(self) -> str:
        return virtual_bucket(self.tenant_slug, self.use_case_slug)

    @property
    def presign_only(self) -> bool:
        return self.credential_id is None

    @property
    def uploader(self) -> str:
        return f"s3:{self.access_key_id}"


def virtual_bucket(tenant_slug: str, use_case_slug: str) -> str:
    """``<tenant slug>-<use case slug>``: both slugs are lower-case letters, digits and
    hyphens, so the name follows S3's bucket rules whenever it is at most 63 characters."""
    return f"{tenant_slug}-{use_case_slug}"


def _principal(access_key_id: str) -> Principal | None:
    use_case_id = presign_use_case_id(access_key_id)
    if use_case_id is not None:
        use_case = UseCase.objects.select_related("tenant").filter(pk=use_case_id).first()
        if use_case is None:
            return None
        derived = presign_credential(use_case_id)
        refusal = (
            "" if use_case.status == UseCaseStatus.APPROVED else "The use case is not approved."
        )
        return Principal(
            access_key_id=access_key_id,
            secret=derived.secret,
            use_case_id=use_case.pk,
            tenant_slug=use_case.tenant.slug,
            use_case_slug=use_case.slug,
            credential_id=None,
            refusal=refusal,
        )
    credential = (
        S3Credential.objects.select_related("use_case__tenant")
        .filter(access_key_id=access_key_id)
        .first()
    )
    if credential is None:
        return None
    refusal = ""
    if credential.status != ApiKeyStatus.ACTIVE:
        refusal = f"This S3 credential is {credential.status}."
    elif credential.expires_at is not None and credential.expires_at <= timezone.now():
        refusal = "This S3 credential has expired."
    elif credential.use_case.status != UseCaseStatus.APPROVED:
        refusal = f"The use case is {credential.use_case.status}, not approved."
    return Principal(
        access_key_id=access_key_id,
        secret=secret_of(credential) if not refusal else "",
        use_case_id=credential.use_case_id,
        tenant_slug=credential.use_case.tenant.slug,
        use_case_slug=credential.use_case.slug,
        credential_id=credential.pk,
        refusal=refusal,
    )


class PrincipalCache:
    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._entries: dict[str, tuple[float, Principal]] = {}

    async def get(self, access_key_id: str) -> Principal:
        now = time.monotonic()
        cached = self._entries.get(access_key_id)
        if cached is not None and now - cached[0] < self.ttl:
            principal = cached[1]
        else:
            found: Principal | None = await database_sync_to_async(_principal)(access_key_id)
            if found is None:
                self._entries.pop(access_key_id, None)
                raise S3Error(
                    "InvalidAccessKeyId",
                    "The AWS Access Key Id you provided does not exist in our records.",
                )
            principal = found
            if len(self._entries) > 10_000:  # bounded: ids are attacker-chosen only if they exist
                self._entries.clear()
            self._entries[access_key_id] = (now, principal)
        if principal.refusal:
            raise S3Error("InvalidAccessKeyId", principal.refusal)
        return principal


class UsageRecorder:
    """``last_used_at``, coalesced: ids seen since the last flush, written in one UPDATE."""

    def __init__(self) -> None:
        self._seen: set[int] = set()

    def saw(self, principal: Principal) -> None:
        if principal.credential_id is not None:
            self._seen.add(principal.credential_id)

    async def flush(self) -> None:
        if not self._seen:
            return
        ids, self._seen = self._seen, set()
        await database_sync_to_async(_touch)(ids)


def _touch(ids: set[int]) -> None:
    S3Credential.objects.filter(pk__in=ids).update(last_used_at=timezone.now())
