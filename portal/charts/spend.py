"""Spend: the persisted usage roll-ups priced with the price in force when the tokens were used.

The database sums the usage per group (a bucket, a use case) × model × price in force, the
price being picked per minute row by a correlated subquery (the latest price that started at
or before that minute); Python then multiplies those sums by the prices as exact ``Decimal``s.
Two queries whatever the range: one for the sums, one for the prices they name. Usage of a
model with no price in force is kept apart as unpriced tokens, never counted as 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import OuterRef, QuerySet, Subquery, Sum

from governance.models import ModelPrice
from governance.prices import Price, money_text, price_of
from records.models import UsageMinute


@dataclass(frozen=True)
class PricedUsage:
    """Tokens of one model in one group, all used while one price (or none) was in force."""

    group: tuple[Any, ...]  # the values of the fields the usage was grouped by
    model: str
    prompt_tokens: int
    completion_tokens: int
    price: Price | None

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def amount(self) -> Decimal | None:
        """What the tokens cost; None where no price was in force (not 0: unknown)."""
        if self.price is None:
            return None
        return self.price.spend(
            prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens
        )


def _price_in_force() -> Subquery:
    return Subquery(
        ModelPrice.objects.filter(
            model__public_id=OuterRef("model"), effective_from__lte=OuterRef("minute")
        )
        .order_by("-effective_from")
        .values("pk")[:1]
    )


def usage_priced(usage: QuerySet[UsageMinute], group: Sequence[str]) -> list[PricedUsage]:
    """``usage`` summed per ``group`` fields (names of fields or annotations of ``usage``),
    model and price in force, each sum with its price."""
    rows = list(
        usage.annotate(price_id=_price_in_force())
        .values(*group, "model", "price_id")
        .annotate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
        .order_by()
    )
    ids = {row["price_id"] for row in rows if row["price_id"] is not None}
    prices = {row.pk: price_of(row) for row in ModelPrice.objects.filter(pk__in=ids)}
    return [
        PricedUsage(
            group=tuple(row[name] for name in group),
            model=row["model"],
            prompt_tokens=int(row["prompt"] or 0),
            completion_tokens=int(row["completion"] or 0),
            price=prices.get(row["price_id"]),
        )
        for row in rows
    ]


@dataclass(frozen=True)
class SpendSummary:
    """A period's spend: the priced amount, and the tokens of each model that had no price."""

    amount: Decimal
    priced: bool  # some of the usage had a price (else the amount says nothing: "no price")
    unpriced_tokens: dict[str, int]

    @property
    def used(self) -> bool:
        return self.priced or bool(self.unpriced_tokens)

    @property
    def amount_text(self) -> str:
        return money_text(self.amount)


def spend_by_use_case(use_case_ids: Sequence[int], since: datetime) -> dict[int, SpendSummary]:
    """Each use case's spend from ``since`` until now (My usage: this month), in two queries."""
    usage = UsageMinute.objects.filter(use_case_id__in=list(use_case_ids), minute__gte=since)
    amounts: dict[int, Decimal] = {}
    unpriced: dict[int, dict[str, int]] = {}
    for part in usage_priced(usage, ("use_case_id",)):
        (use_case_id,) = part.group
        amount = part.amount
        if amount is not None:
            amounts[use_case_id] = amounts.get(use_case_id, Decimal(0)) + amount
        elif part.tokens:
            by_model = unpriced.setdefault(use_case_id, {})
            by_model[part.model] = by_model.get(part.model, 0) + part.tokens
    return {
        pk: SpendSummary(
            amount=amounts.get(pk, Decimal(0)),
            priced=pk in amounts,
            unpriced_tokens=dict(sorted(unpriced.get(pk, {}).items())),
        )
        for pk in use_case_ids
    }
