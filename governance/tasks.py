from __future__ import annotations

from celery import shared_task

from governance.anchors import checkpoint_write
from governance.services.model_lifecycle import models_retire_sunset
from governance.snapshot import snapshot_publish


@shared_task(
    name="governance.publish_policy_snapshot",
    autoretry_for=(ConnectionError, OSError),
    retry_backoff=True,
    max_retries=5,
)
def publish_policy_snapshot() -> int:
    """Republish the gateway's policy snapshot; also runs on beat as a safety net."""
    return snapshot_publish()


@shared_task(name="governance.anchor_audit_chain", ignore_result=True)
def anchor_audit_chain() -> int | None:
    """Sign the audit chain's head into a checkpoint outside the database (on beat)."""
    checkpoint = checkpoint_write()
    return checkpoint.sequence if checkpoint is not None else None


@shared_task(name="governance.retire_sunset_models", ignore_result=True)
def retire_sunset_models() -> list[str]:
    """Retire deprecated models whose sunset has passed (on beat). Bookkeeping only: the
    gateway already refuses or reroutes them at the sunset, from the snapshot's time."""
    return models_retire_sunset()
