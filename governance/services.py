"""Writes to the governance domain. Each service republishes the policy snapshot on commit."""

from __future__ import annotations

import logging
from datetime import datetime

import valkey
from django.db import transaction

from governance.choices import ApiKeyStatus
from governance.keys import key_generate, key_hash, key_visible_prefix
from governance.models import ApiKey, UseCase
from governance.snapshot import snapshot_publish

logger = logging.getLogger(__name__)


def _publish_after_commit() -> None:
    try:
        snapshot_publish()
    except valkey.ValkeyError as exc:
        # The change is committed; the periodic republish (scheduler beat) carries it to the
        # gateway once Valkey is back. Nothing is lost, it is only late.
        logger.warning("policy_snapshot_publish_deferred error=%s", exc.__class__.__name__)


def policy_changed() -> None:
    """Republish the gateway's snapshot once the current transaction commits."""
    transaction.on_commit(_publish_after_commit)


@transaction.atomic
def api_key_issue(
    *, use_case: UseCase, name: str, expires_at: datetime | None = None
) -> tuple[ApiKey, str]:
    """Mint an active key; returns the row and the plaintext, which is never stored."""
    plaintext = key_generate()
    key = ApiKey.objects.create(
        use_case=use_case,
        name=name,
        prefix=key_visible_prefix(plaintext),
        key_hash=key_hash(plaintext),
        status=ApiKeyStatus.ACTIVE,
        expires_at=expires_at,
    )
    policy_changed()
    return key, plaintext


@transaction.atomic
def api_key_revoke(*, key: ApiKey) -> ApiKey:
    key.status = ApiKeyStatus.REVOKED
    key.save(update_fields=["status"])
    policy_changed()
    return key
