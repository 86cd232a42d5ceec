"""A model's price history as the officer's pages show it: which price is in force, which
are history and which are still to come (only those can be corrected or withdrawn)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Literal

from governance.models import Model, ModelPrice
from governance.prices import Price, amount_text, moment_text, price_table

PriceState = Literal["past", "in force", "future"]


@dataclass(frozen=True)
class PriceRow:
    pk: int
    starts: str  # as policy files write it: UTC, with a Z
    input_per_mtok: str  # the exact digits, never rounded: a price is not an invoice
    output_per_mtok: str
    state: PriceState

    @property
    def changeable(self) -> bool:
        """Only a price not yet in force: one in force has priced usage already."""
        return self.state == "future"


def price_history(*, model: Model, now: datetime) -> list[PriceRow]:
    """The model's prices, newest first, each marked past, in force or future at ``now``."""
    prices: list[ModelPrice] = list(model.prices.order_by("effective_from"))
    current = next((p for p in reversed(prices) if p.effective_from <= now), None)
    rows = []
    for price in prices:
        state: PriceState
        if price.effective_from > now:
            state = "future"
        elif current is not None and price.pk == current.pk:
            state = "in force"
        else:
            state = "past"
        rows.append(
            PriceRow(
                pk=price.pk,
                starts=moment_text(price.effective_from),
                input_per_mtok=amount_text(Decimal(price.input_per_mtok)),
                output_per_mtok=amount_text(Decimal(price.output_per_mtok)),
                state=state,
            )
        )
    return list(reversed(rows))


@dataclass(frozen=True)
class PriceNow:
    starts: str
    input_per_mtok: str
    output_per_mtok: str


def _now_of(price: Price | None) -> PriceNow | None:
    if price is None:
        return None
    return PriceNow(
        starts=moment_text(price.effective_from),
        input_per_mtok=amount_text(price.input_per_mtok),
        output_per_mtok=amount_text(price.output_per_mtok),
    )


def prices_in_force(*, models: Iterable[Model], now: datetime) -> dict[int, PriceNow | None]:
    """Each model's price at ``now`` (None where it has none), in one query: the list page."""
    listed = list(models)
    table = price_table(m.public_id for m in listed)
    return {m.pk: _now_of(table.at(m.public_id, now)) for m in listed}
