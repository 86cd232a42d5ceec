"""The rules that span one use case's guardrail selections, whatever the door writes them.

One writer at a time (the use case's row, locked), settings checked against the catalogue
and stored complete, and positions kept 0, 1, 2… in run order. The generic record services
apply them to every selection they save; ``guardrail_selections`` reorders under the lock.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError

from governance.guardrail_selections import selection_validate
from governance.models import GuardrailSelection, UseCase


def guardrails_lock(use_case_id: int) -> None:
    """Serialise changes to one use case's guardrails (its row, FOR UPDATE): two officers
    adding or reordering at once must not both read the same positions."""
    list(UseCase.objects.select_for_update().filter(pk=use_case_id).values_list("pk"))


def guardrail_prepare(selection: GuardrailSelection, *, creating: bool) -> None:
    if selection.use_case_id is None:
        raise ValidationError({"use_case": "Name the use case."})
    guardrails_lock(selection.use_case_id)
    if not creating:
        stored = GuardrailSelection.objects.get(pk=selection.pk)
        if stored.use_case_id != selection.use_case_id:
            raise ValidationError({"use_case": "A selection cannot move to another use case."})
    selection.config = selection_validate(
        use_case=selection.use_case,
        guardrail=selection.guardrail,
        side=selection.side,
        action=selection.action,
        config=selection.config,
        exclude_pk=None if creating else selection.pk,
    )


def guardrails_renumber(use_case_id: int, moved: GuardrailSelection | None = None) -> None:
    """Positions 0, 1, 2… with ``moved`` at the place it asks for and the others, in their
    order, around it: a selection put at 0 runs first and the rest move down one."""
    rows = GuardrailSelection.objects.filter(use_case_id=use_case_id)
    if moved is not None:
        rows = rows.exclude(pk=moved.pk)
    others = list(rows.order_by("position", "pk"))
    if moved is not None and moved.pk is not None:
        others.insert(min(moved.position, len(others)), moved)
    for index, selection in enumerate(others):
        if selection.position != index or selection is moved:
            GuardrailSelection.objects.filter(pk=selection.pk).update(position=index)
            selection.position = index
