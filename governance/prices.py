"""Model prices and their history: which price applies when, what spend a use costs, and what
may change (docs/policy-as-code.md "Prices").

A price is in force from its ``effective_from`` until the model's next price starts. Spend is
always priced with the price in force when the tokens were used, so the history must not be
rewritten behind a finance report: a price already in force is never changed or deleted, and
a new price may start in the past only where no price was in force (before the model's first
price, filling what was shown as "no price"). Policy as code, the API and the portal's forms
all go through the functions here, so the rule holds whatever the door.

Amounts are ``Decimal`` from end to end: a float cannot hold 0.10 exactly, and a sum of
float cents drifts.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, Final

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from governance.audit import Actor, audit_record, object_state
from governance.models import Model, ModelPrice
from governance.roles import can_govern

TOKENS_PER_PRICE: Final = 1_000_000  # prices are per million tokens
DECIMAL_PLACES: Final = 6  # ModelPrice's columns
INTEGER_DIGITS: Final = 12  # max_digits 18 less the decimal places


class PriceError(ValueError):
    """A price, or a change to a model's price history, that cannot be accepted; the message
    says why in words a form or a policy file can show."""


@dataclass(frozen=True)
class Price:
    """One price of one model, as policy as code and the spend computation read it."""

    effective_from: datetime  # aware, UTC
    input_per_mtok: Decimal
    output_per_mtok: Decimal
    pk: int | None = None  # the row, where it is stored

    def spend(self, *, prompt_tokens: int, completion_tokens: int) -> Decimal:
        """What these tokens cost at this price, exactly (no rounding)."""
        return (
            Decimal(prompt_tokens) * self.input_per_mtok
            + Decimal(completion_tokens) * self.output_per_mtok
        ) / TOKENS_PER_PRICE


# --- values ---------------------------------------------------------------------------------
def price_amount(value: Any) -> Decimal:
    """A price per million tokens from what a file, form or API gives: a decimal string, an
    integer or a decimal; a YAML float is taken as the digits written (0.1 is 0.1)."""
    if isinstance(value, bool) or value is None:
        raise PriceError('must be a decimal amount such as "0.50"')
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PriceError("must be a finite amount")
        value = repr(value)  # the shortest digits that read back as this float: as written
    try:
        amount = Decimal(value) if isinstance(value, str | int | Decimal) else None
    except InvalidOperation:
        amount = None
    if amount is None or not amount.is_finite():
        raise PriceError(f'must be a decimal amount such as "0.50" (got {value!r})')
    if amount < 0:
        raise PriceError("must not be negative")
    if amount.adjusted() >= INTEGER_DIGITS:
        raise PriceError(f"must be less than 10^{INTEGER_DIGITS}")
    if amount.quantize(Decimal(1).scaleb(-DECIMAL_PLACES)) != amount:
        raise PriceError(f"must have at most {DECIMAL_PLACES} decimal places")
    return amount


def price_moment(value: Any) -> datetime:
    """When a price starts: an ISO 8601 date and time with a time zone (a string, or the
    datetime YAML reads from an unquoted one), in UTC. A time without a zone is refused: in
    a bank with offices in several zones, midnight is not one moment."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise PriceError(
                f"must be an ISO 8601 date and time with a time zone, e.g. "
                f"2026-01-01T00:00:00Z (got {value!r})"
            ) from None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise PriceError("must give a time zone, e.g. 2026-01-01T00:00:00Z or +01:00")
        try:
            return value.astimezone(UTC)
        except OverflowError:  # 0001-01-01T00:00+01:00 is before the first UTC moment
            raise PriceError("is out of the range of dates") from None
    if isinstance(value, date):
        raise PriceError("must be a date and time with a time zone, e.g. 2026-01-01T00:00:00Z")
    raise PriceError(
        "must be an ISO 8601 date and time with a time zone, e.g. 2026-01-01T00:00:00Z"
    )


def amount_text(amount: Decimal) -> str:
    """The exact amount as plain digits ("0.5", "12", never "1E+1"): what files and CSVs hold."""
    text = format(amount.normalize(), "f")
    return text if text != "-0" else "0"


def moment_text(moment: datetime) -> str:
    """A price's start as policy files write it: UTC, with a Z."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def money_text(amount: Decimal) -> str:
    """An amount for people: to the cent (half up, as on an invoice), thousands separated; a
    fraction of a cent keeps its digits rather than reading as 0.00."""
    if amount and abs(amount) < Decimal("0.01"):
        return amount_text(amount)
    return f"{amount.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP):,.2f}"


def currency() -> str:
    """The company's currency (``SWITCHYARD_CURRENCY``): every price and spend is in it."""
    return str(settings.CURRENCY)


# --- a price list and its history ------------------------------------------------------------
def prices_problems(prices: Sequence[Price]) -> list[str]:
    """What is wrong with one model's list of prices on its own: two that start together."""
    seen: set[datetime] = set()
    problems = []
    for price in prices:
        if price.effective_from in seen:
            problems.append(f"two prices start at {moment_text(price.effective_from)}")
        seen.add(price.effective_from)
    return problems


def history_problem(
    *,
    starts: Iterable[datetime],
    effective_from: datetime,
    creating: bool,
    now: datetime,
) -> str | None:
    """Why adding (``creating``), changing or deleting the price starting at ``effective_from``
    would rewrite spend already reported, given the model's stored prices' ``starts``; None
    when it would not."""
    if effective_from > now:
        return None  # not in force yet: nothing has been priced with it
    if not creating:
        return (
            f"is in force since {moment_text(effective_from)}: a price in force is never "
            "changed or deleted (add a new price from now on)"
        )
    earlier = [start for start in starts if start < effective_from]
    if earlier:
        return (
            f"starts in the past, while the price from {moment_text(max(earlier))} was in "
            "force: it would reprice usage already priced (start it now or later)"
        )
    return None


class PriceTable:
    """Every model's prices, for looking up the price in force at a moment without a query."""

    def __init__(self, prices: Iterable[tuple[str, Price]]) -> None:
        self._by_model: dict[str, list[Price]] = {}
        for model, price in prices:
            self._by_model.setdefault(model, []).append(price)
        for listed in self._by_model.values():
            listed.sort(key=lambda p: p.effective_from)
        self._starts = {m: [p.effective_from for p in ps] for m, ps in self._by_model.items()}

    def of(self, model: str) -> list[Price]:
        return list(self._by_model.get(model, ()))

    def at(self, model: str, moment: datetime) -> Price | None:
        """The price of ``model`` in force at ``moment``; None where it had none."""
        starts = self._starts.get(model)
        if not starts:
            return None
        index = bisect.bisect_right(starts, moment) - 1
        return self._by_model[model][index] if index >= 0 else None


def price_of(row: ModelPrice) -> Price:
    return Price(
        effective_from=row.effective_from.astimezone(UTC),
        input_per_mtok=Decimal(row.input_per_mtok),
        output_per_mtok=Decimal(row.output_per_mtok),
        pk=row.pk,
    )


def price_table(models: Iterable[str] | None = None) -> PriceTable:
    """The stored prices of ``models`` (public ids; all models when None), in one query."""
    rows = ModelPrice.objects.select_related("model")
    if models is not None:
        rows = rows.filter(model__public_id__in=list(models))
    return PriceTable((row.model.public_id, price_of(row)) for row in rows)


def price_in_force(*, model: Model | str, at: datetime) -> Price | None:
    """The price of one model at one moment (for a form's "current price"); None if none."""
    public_id = model.public_id if isinstance(model, Model) else model
    row = (
        ModelPrice.objects.filter(model__public_id=public_id, effective_from__lte=at)
        .order_by("-effective_from")
        .first()
    )
    return price_of(row) if row is not None else None


# --- writes: authorised, checked against the history, audited --------------------------------
def _require_governor(actor: Actor) -> None:
    """Officers and admins set prices (as they register models); the platform may too."""
    if actor.is_system:
        return
    user: AbstractBaseUser | None = actor.user
    if user is None or not user.is_authenticated or not can_govern(user):
        raise PermissionDenied("Only a governance officer or an admin may set model prices.")


def _refuse(field: str, message: str | None) -> None:
    if message is not None:
        raise ValidationError({field: message})


def _amounts(input_per_mtok: Any, output_per_mtok: Any) -> tuple[Decimal, Decimal]:
    amounts: dict[str, Decimal] = {}
    errors: dict[str, str] = {}
    for name, value in (("input_per_mtok", input_per_mtok), ("output_per_mtok", output_per_mtok)):
        try:
            amounts[name] = price_amount(value)
        except PriceError as exc:
            errors[name] = str(exc)
    if errors:
        raise ValidationError(errors)
    # As the column stores them, so the audit trail shows what was stored ("0.500000").
    step = Decimal(1).scaleb(-DECIMAL_PLACES)
    return amounts["input_per_mtok"].quantize(step), amounts["output_per_mtok"].quantize(step)


def _locked_starts(model: Model) -> list[datetime]:
    """The model's price starts, with its row locked so two officers cannot both add a price
    judged against the same history."""
    Model.objects.select_for_update().filter(pk=model.pk).first()
    return list(model.prices.values_list("effective_from", flat=True))


@transaction.atomic
def model_price_add(
    *,
    actor: Actor,
    model: Model,
    effective_from: datetime | str,
    input_per_mtok: Decimal | str | int,
    output_per_mtok: Decimal | str | int,
    now: datetime | None = None,
) -> ModelPrice:
    """Add a price to a model's history (what a form's "new price" calls). Raises
    ``ValidationError`` keyed by field for a bad value, a start already taken, or a start in
    the past that would reprice usage already priced."""
    _require_governor(actor)
    try:
        start = price_moment(effective_from)
    except PriceError as exc:
        raise ValidationError({"effective_from": str(exc)}) from None
    input_amount, output_amount = _amounts(input_per_mtok, output_per_mtok)
    starts = _locked_starts(model)
    if start in starts:
        _refuse("effective_from", f"the model already has a price from {moment_text(start)}")
    _refuse(
        "effective_from",
        history_problem(
            starts=starts, effective_from=start, creating=True, now=now or timezone.now()
        ),
    )
    price = ModelPrice(
        model=model,
        effective_from=start,
        input_per_mtok=input_amount,
        output_per_mtok=output_amount,
    )
    price.full_clean()
    price.save()
    audit_record(actor=actor, action="modelprice.create", obj=price, after=object_state(price))
    return price


@transaction.atomic
def model_price_update(
    *,
    actor: Actor,
    price: ModelPrice,
    input_per_mtok: Decimal | str | int,
    output_per_mtok: Decimal | str | int,
    now: datetime | None = None,
) -> ModelPrice:
    """Correct a price that is not in force yet; one in force is history and is refused."""
    _require_governor(actor)
    input_amount, output_amount = _amounts(input_per_mtok, output_per_mtok)
    _locked_starts(price.model)
    before = object_state(ModelPrice.objects.get(pk=price.pk))
    _refuse(
        "effective_from",
        history_problem(
            starts=(),
            effective_from=price.effective_from,
            creating=False,
            now=now or timezone.now(),
        ),
    )
    price.input_per_mtok, price.output_per_mtok = input_amount, output_amount
    price.full_clean()
    price.save()
    after = object_state(price)
    if after != before:
        audit_record(actor=actor, action="modelprice.update", obj=price, before=before, after=after)
    return price


@transaction.atomic
def model_price_delete(*, actor: Actor, price: ModelPrice, now: datetime | None = None) -> None:
    """Withdraw a price that is not in force yet; one in force is history and is refused."""
    _require_governor(actor)
    _locked_starts(price.model)
    _refuse(
        "effective_from",
        history_problem(
            starts=(),
            effective_from=price.effective_from,
            creating=False,
            now=now or timezone.now(),
        ),
    )
    audit_record(actor=actor, action="modelprice.delete", obj=price, before=object_state(price))
    price.delete()
