"""A model's prices, from the officer's model page: add one, correct or withdraw a future one.

Each is one edit of the model's record of the policy file (``models[].prices``), planned,
reviewed and applied like the other officer forms, so the history rules of
``governance.prices`` (a price in force is never changed; a new one starts in the past only
before the model's first) come back from the plan onto the "From" field, and every price
written is audited (``modelprice.*``) under the officer's name.
"""

from __future__ import annotations

import re

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone

from governance.models import Model, ModelPrice
from governance.prices import currency, moment_text
from portal.officer.forms import OfficerForm, PriceForm, WithdrawPriceForm, next_midnight
from portal.officer.plans import Edit, current_record
from portal.officer.views import Page, _data, _step, officer_only

# ``prices[<start or index>].<name>`` (after ``models[<id>].``) → the price form's fields; a
# problem of the price as a whole (the history rule, two starts alike) is about its start.
_PRICE_PLACE = re.compile(r"prices(?:\[[^\]]*\])?(?:\.(?P<name>\w+))?")
_PRICE_FIELDS = {
    "from": "effective_from",
    "input_per_mtok": "input_per_mtok",
    "output_per_mtok": "output_per_mtok",
}


def price_field_of(place: str) -> str | None:
    found = _PRICE_PLACE.fullmatch(place)
    if found is None:
        return None
    return _PRICE_FIELDS.get(found.group("name") or "from")


def _price_page(
    request: HttpRequest, model: Model, price: ModelPrice | None, *, withdraw: bool = False
) -> HttpResponse:
    current = current_record("models", model.public_id)
    assert current is not None
    listed = list(current.get("prices", []))
    now = timezone.now()
    back = reverse("portal:model_edit", args=[model.pk]) + "#prices"
    form: OfficerForm
    if withdraw:
        assert price is not None
        form = WithdrawPriceForm(_data(request), price=price, now=now)
    else:
        initial = PriceForm.initial_of(price) if price else {"effective_from": next_midnight(now)}
        form = PriceForm(_data(request), initial=initial, editing=price)

    def starts() -> str:
        if price is not None:
            return moment_text(price.effective_from)
        return moment_text(form.cleaned_data["effective_from"])

    def form_entry() -> dict[str, str]:
        assert isinstance(form, PriceForm)
        return form.entry()

    def edit() -> Edit:
        if price is None:  # a start already taken stays twice: the parser names it
            kept = [*listed, form_entry()]
        else:
            kept = [p for p in listed if p["from"] != starts()]
            if not withdraw:
                kept.append(form_entry())
        # A withdrawal is planned with prune, as ``policy apply --prune`` would plan it.
        return Edit("models", model.public_id, {**current, "prices": kept}, prune=withdraw)

    in_force = price is not None and price.effective_from <= now
    if withdraw:
        title, verb = f"Withdraw the price of {model.public_id} from {starts()}", "withdrawn"
    elif price is not None:
        title, verb = f"Correct the price of {model.public_id} from {starts()}", "saved"
    else:
        title, verb = f"New price of {model.public_id}", "saved"
    if in_force:
        intro = (
            "This price is in force: usage has been priced with it, so it is history and "
            "cannot be changed or withdrawn. Add a new price from now on instead."
        )
    elif withdraw:
        intro = "Nothing has been priced with it yet; the price before it stays in force."
    else:
        intro = f"Amounts in {currency()}, per million tokens."
    return _step(
        request,
        Page(
            title=title,
            form=form,
            edit=edit,
            field_of=price_field_of,
            prefix=lambda: f"models[{model.public_id}]",
            done=lambda: back,
            done_message=lambda: f"Price of {model.public_id} from {starts()} {verb}.",
            back=back,
            intro=intro,
            errors_on_fixed_fields=True,
        ),
    )


@officer_only
def price_new(request: HttpRequest, pk: int) -> HttpResponse:
    return _price_page(request, get_object_or_404(Model, pk=pk), None)


def _price(pk: int, price_pk: int) -> ModelPrice:
    return get_object_or_404(ModelPrice.objects.select_related("model"), pk=price_pk, model_id=pk)


@officer_only
def price_edit(request: HttpRequest, pk: int, price_pk: int) -> HttpResponse:
    price = _price(pk, price_pk)
    return _price_page(request, price.model, price)


@officer_only
def price_withdraw(request: HttpRequest, pk: int, price_pk: int) -> HttpResponse:
    price = _price(pk, price_pk)
    return _price_page(request, price.model, price, withdraw=True)
