"""Guardrail selections: which guardrails a use case runs, on which side, in what order.

Officers only (the generic record services check it): a guardrail decides what a use case
may send and receive. Each selection is validated against the catalogue and the registered
models, stored with its complete settings, audited, and republished.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from governance.audit import Actor, audit_record
from governance.choices import GuardrailFailure
from governance.models import GuardrailSelection, UseCase
from governance.services.authority import require_governor
from governance.services.generic_records import record_create, record_delete, record_update
from governance.services.guardrail_positions import guardrails_lock
from governance.services.republish import policy_changed
from governance.services.use_cases import use_case_update


def _guardrail_order(use_case: UseCase) -> list[str]:
    return [
        f"{g.guardrail}:{g.side}"
        for g in GuardrailSelection.objects.filter(use_case=use_case).order_by("position", "pk")
    ]


def guardrail_add(
    *,
    actor: Actor,
    use_case: UseCase,
    guardrail: str,
    side: str,
    action: str,
    config: Any = None,
    position: int | None = None,
) -> GuardrailSelection:
    """Select a guardrail for a use case; ``position`` None runs it after the others, a
    number puts it there and moves the others down."""
    require_governor(actor)
    count = GuardrailSelection.objects.filter(use_case=use_case).count()
    if position is not None and not 0 <= position <= count:
        raise ValidationError({"position": f"Choose a position from 0 to {count}."})
    selection = GuardrailSelection(
        use_case=use_case,
        guardrail=guardrail,
        side=side,
        action=action,
        config=config if config is not None else {},
        position=count if position is None else position,
    )
    return record_create(actor=actor, instance=selection)


def guardrail_change(
    *, actor: Actor, selection: GuardrailSelection, changes: Mapping[str, Any]
) -> GuardrailSelection:
    """Change a selection's guardrail, stage, mode, settings or place."""
    unknown = sorted(set(changes) - {"guardrail", "side", "action", "config", "position"})
    if unknown:
        raise ValidationError({unknown[0]: "This field cannot be changed here."})
    return record_update(actor=actor, instance=selection, changes=changes)


def guardrail_remove(*, actor: Actor, selection: GuardrailSelection) -> None:
    record_delete(actor=actor, instance=selection)


@transaction.atomic
def guardrail_reorder(
    *, actor: Actor, use_case: UseCase, order: Sequence[int]
) -> list[GuardrailSelection]:
    """Run the use case's selections in ``order`` (their ids, every one exactly once)."""
    require_governor(actor)
    guardrails_lock(use_case.pk)
    current = {g.pk: g for g in GuardrailSelection.objects.filter(use_case=use_case)}
    if len(set(order)) != len(order):
        raise ValidationError({"order": "Name each selection once."})
    if set(order) != set(current):
        missing = sorted(set(current) - set(order))
        foreign = sorted(set(order) - set(current))
        detail = (
            f"selections {foreign} are not this use case's"
            if foreign
            else f"selections {missing} are missing"
        )
        raise ValidationError({"order": f"List every selection of this use case: {detail}."})
    before = _guardrail_order(use_case)
    for index, pk in enumerate(order):
        if current[pk].position != index:
            GuardrailSelection.objects.filter(pk=pk).update(position=index)
    after = _guardrail_order(use_case)
    if after != before:
        audit_record(
            actor=actor,
            action="usecase.guardrails_reorder",
            obj=use_case,
            before={"guardrails": before},
            after={"guardrails": after},
            tenant_slug=use_case.tenant.slug,
        )
        policy_changed()
    return list(GuardrailSelection.objects.filter(use_case=use_case).order_by("position"))


def use_case_set_guardrail_failure(*, actor: Actor, use_case: UseCase, mode: str) -> UseCase:
    """Fail closed (503 when a guardrail cannot run) or open (let through, record it)."""
    require_governor(actor)
    if mode not in GuardrailFailure.values:
        raise ValidationError(
            {"guardrail_failure": f"Choose one of {', '.join(GuardrailFailure.values)}."}
        )
    return use_case_update(actor=actor, use_case=use_case, changes={"guardrail_failure": mode})
