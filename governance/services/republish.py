"""Republish the gateway's policy snapshot once a governance write commits.

Every change the gateway reads calls ``policy_changed``; the snapshot is the only contract
between governance and the data path, so a write it missed would never reach the gateway.
"""

from __future__ import annotations

import logging

import valkey
from django.db import transaction

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
    """Republish the gateway's snapshot once the current transaction commits.

    However many writes a transaction makes (an admin form, a policy-as-code apply of a
    hundred records), it republishes once: the snapshot is rebuilt whole each time anyway.
    """
    connection = transaction.get_connection()
    already = any(callback is _publish_after_commit for _, callback, *_ in connection.run_on_commit)
    if not already or not connection.in_atomic_block:
        transaction.on_commit(_publish_after_commit)
