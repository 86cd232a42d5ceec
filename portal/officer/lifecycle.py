"""On a deprecated or retired model's entry, the use cases still calling it with their recent
volume, for the officer who set the sunset (docs/models.md). The owners' side, the notice on
a use case's page, is ``portal.selectors.model_notices``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from governance.choices import ModelStatus
from governance.models import Model, UseCase
from records.selectors import model_callers

# "Recent": long enough to see a weekly job, short enough to show who moved already.
RECENT = timedelta(days=7)


@dataclass(frozen=True)
class Caller:
    use_case: UseCase | None  # None: a use case deleted since (its id is all the roll-up has)
    use_case_id: int
    requests: int
    tokens: int
    last_call: datetime | None  # None: approved for the model, no call in the window


def callers_by_model(models: Sequence[Model], *, now: datetime) -> dict[int, list[Caller]]:
    """For each model that is not active: every use case approved for it or that called it
    in the last ``RECENT``, busiest first (the approved ones with no call last)."""
    found: dict[int, list[Caller]] = {}
    for model in models:
        if model.status == ModelStatus.ACTIVE:
            continue
        called = model_callers(model=model.public_id, since=now - RECENT)
        approved = {u.pk: u for u in model.use_cases.select_related("tenant")}
        others = UseCase.objects.select_related("tenant").in_bulk(
            [c.use_case_id for c in called if c.use_case_id not in approved]
        )
        rows = [
            Caller(
                approved.get(c.use_case_id) or others.get(c.use_case_id),
                c.use_case_id,
                c.requests,
                c.tokens,
                c.last_minute,
            )
            for c in called
        ]
        seen = {c.use_case_id for c in called}
        rows += [Caller(u, pk, 0, 0, None) for pk, u in approved.items() if pk not in seen]
        found[model.pk] = rows
    return found
