"""A model's lifecycle across rows: active → deprecated (until its sunset) → retired.

The model row guards its own fields (``Model.clean``); here are the rules that read other
rows — the successor's status, its capabilities, the chain of successors — and the retirement
of models whose sunset has passed, which beat runs (``governance.retire_sunset_models``). The
gateway does not wait for that task: it decides by the sunset's time from the snapshot, so a
model is refused (or handed to its successor) at the second of its sunset whatever beat does.
"""

from __future__ import annotations

import logging
from datetime import datetime

from celery import current_app
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from governance.audit import Actor, audit_record, object_state
from governance.choices import ModelStatus
from governance.models import Model
from governance.services.republish import policy_changed

logger = logging.getLogger(__name__)

#: scheduler/tasks.py's task, sent by name.
DELIVER_MODEL_NOTICE_TASK = "scheduler.deliver_model_notice"

# Audit actions besides the generic ``model.update``: what happened, for whoever reads the trail.
STATUS_ACTIONS = {
    ModelStatus.DEPRECATED: "model.deprecated",
    ModelStatus.RETIRED: "model.retired",
    ModelStatus.ACTIVE: "model.reactivated",
}


def lifecycle_prepare(model: Model, *, previous_status: str | None) -> None:
    """Check the successor against its own row and stamp ``deprecated_at`` on the write that
    deprecates (or clear it when the model is active again). ``previous_status`` is None for a
    new model."""
    if model.status == ModelStatus.DEPRECATED and previous_status != ModelStatus.DEPRECATED:
        model.deprecated_at = timezone.now()
    elif model.status == ModelStatus.ACTIVE:
        model.deprecated_at = None
    elif model.status == ModelStatus.RETIRED and model.deprecated_at is None:
        model.deprecated_at = timezone.now()  # retired straight away: deprecated as of now
    successor = model.successor
    if successor is None or (model.pk is not None and successor.pk == model.pk):
        return  # no successor, or the row's own rule (Model.clean) says what is wrong
    if model.status == ModelStatus.ACTIVE:
        return  # kept from an earlier deprecation, unused while active
    if successor.status == ModelStatus.RETIRED:
        raise ValidationError({"successor": f"'{successor.public_id}' is retired."})
    missing = sorted(set(model.capabilities or []) - set(successor.capabilities or []))
    if missing:
        raise ValidationError(
            {
                "successor": f"'{successor.public_id}' lacks {', '.join(missing)}, which "
                f"'{model.public_id}' offers: its callers could not move to it."
            }
        )
    seen = {model.pk, successor.pk}
    step = successor.successor
    while step is not None:
        if step.pk in seen:
            raise ValidationError(
                {"successor": f"'{successor.public_id}' leads back to '{model.public_id}'."}
            )
        seen.add(step.pk)
        step = step.successor


def lifecycle_audit(
    *, actor: Actor, model: Model, previous_status: str | None, tenant_slug: str = ""
) -> None:
    """The event that says what happened to the model's status, after the write's own."""
    if previous_status == model.status or (
        previous_status is None and model.status == ModelStatus.ACTIVE
    ):
        return
    audit_record(
        actor=actor,
        action=STATUS_ACTIONS[ModelStatus(model.status)],
        obj=model,
        after={
            "status": model.status,
            "deprecated_at": model.deprecated_at,
            "sunset_at": model.sunset_at,
            "successor": model.successor.public_id if model.successor else None,
            "at_sunset": model.at_sunset,
            "notice_url": model.notice_url,
        },
        tenant_slug=tenant_slug,
    )
    if model.status == ModelStatus.DEPRECATED:
        owners_notify(model)


def owners_notify(model: Model) -> None:
    """Once the deprecation commits, tell each use case approved for the model through its
    webhook, if it has one (scheduler/model_notices.py, sent by task name: governance imports
    no scheduler). The portal shows the same notice on the use case's page."""
    assert model.deprecated_at is not None
    message_id = f"msg_model_{model.pk}_deprecated_{int(model.deprecated_at.timestamp())}"
    use_cases = list(
        model.use_cases.exclude(webhook_url="")
        .exclude(webhook_secret_sealed="")
        .values_list("pk", flat=True)
    )

    def send() -> None:
        for use_case_id in use_cases:
            try:
                current_app.send_task(
                    DELIVER_MODEL_NOTICE_TASK, args=(model.pk, use_case_id, message_id)
                )
            except Exception:  # a broker that cannot take it loses the webhook, not the write
                logger.exception(
                    "model_notice_enqueue_failed model=%s use_case=%s", model.pk, use_case_id
                )

    if use_cases:
        transaction.on_commit(send)


def models_retire_sunset(*, now: datetime | None = None) -> list[str]:
    """Retire every deprecated model whose sunset has passed, each audited as the system;
    one republish. Idempotent: a model is claimed by a conditional update, so two runs at
    once retire it once."""
    now = now or timezone.now()
    actor = Actor.system("model-lifecycle")
    retired: list[str] = []
    due = Model.objects.filter(status=ModelStatus.DEPRECATED, sunset_at__lte=now)
    for pk in due.values_list("pk", flat=True):
        with transaction.atomic():
            model = Model.objects.select_for_update().filter(pk=pk).first()
            if model is None or model.status != ModelStatus.DEPRECATED:
                continue
            before = object_state(model)
            claimed = Model.objects.filter(pk=pk, status=ModelStatus.DEPRECATED).update(
                status=ModelStatus.RETIRED, updated_at=now
            )
            if not claimed:
                continue
            model.refresh_from_db()
            audit_record(
                actor=actor,
                action="model.update",
                obj=model,
                before=before,
                after=object_state(model),
            )
            lifecycle_audit(actor=actor, model=model, previous_status=ModelStatus.DEPRECATED)
            policy_changed()
            retired.append(model.public_id)
    return retired
