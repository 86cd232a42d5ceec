"""An officer keeps a model's price history from its page in the portal.

Each form is one edit of the model's record of the policy file (``models[].prices``): planned
by the policy-as-code engine, shown as a diff, applied only as reviewed, audited. The history
rules of ``governance.prices`` come back onto the "From" field: a price in force is never
changed or withdrawn, and a new one starts in the past only before the model's first price.
Personas: olivia is a governance officer; alice a developer, audrey an auditor, mallory has
no role.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from governance.models import AuditEvent, Model, ModelPrice
from governance.prices import moment_text, price_in_force
from governance.roles import Role
from testkit.factories import make_model
from tests.portal.test_officer_support import apply, client_for, plan_cells, review, text, url

pytestmark = pytest.mark.django_db

NOW = datetime.now(UTC).replace(microsecond=0)
LAST_YEAR = "2025-01-01T00:00:00Z"
LAST_MONTH = moment_text(NOW - timedelta(days=30))
YESTERDAY = moment_text(NOW - timedelta(days=1))
NEXT_MONTH = moment_text(NOW + timedelta(days=30))
NEXT_YEAR = moment_text(NOW + timedelta(days=365))

_ERROR_ITEM = re.compile(r"<li>(.*?)</li>", re.S)
_PRICE_ROW = re.compile(r'<tr data-price="([^"]+)" class="price-([\w-]+)">(.*?)</tr>', re.S)


def price_data(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "effective_from": NEXT_MONTH,
        "input_per_mtok": "0.25",
        "output_per_mtok": "0.75",
    }
    data.update(changes)
    return data


def add_price(model: Model, starts: str, input_per_mtok: str, output_per_mtok: str) -> ModelPrice:
    """A stored price, as the history already has it (not what the test is about)."""
    return ModelPrice.objects.create(
        model=model,
        effective_from=datetime.fromisoformat(starts),
        input_per_mtok=Decimal(input_per_mtok),
        output_per_mtok=Decimal(output_per_mtok),
    )


def stored(model: Model) -> list[tuple[str, str, str]]:
    return [
        (moment_text(p.effective_from), str(p.input_per_mtok), str(p.output_per_mtok))
        for p in model.prices.order_by("effective_from")
    ]


def field_errors(response: Any, field: str) -> list[str]:
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert field in errors, errors
    return list(errors[field])


@pytest.fixture
def olivia():
    return client_for("olivia", Role.OFFICER)


@pytest.fixture
def llama():
    return make_model("llama")


@pytest.fixture
def priced(llama):
    """llama's history: a price last year, one in force since last month, one next month."""
    return {
        "past": add_price(llama, LAST_YEAR, "0.1", "0.3"),
        "in_force": add_price(llama, LAST_MONTH, "0.2", "0.6"),
        "future": add_price(llama, NEXT_MONTH, "0.25", "0.75"),
    }


# --- the history, on the model's page and on the list ----------------------------------------
def test_the_model_page_shows_the_price_history_newest_first_with_its_state(
    olivia, llama, priced
) -> None:
    html = olivia.get(url("model_edit", llama.pk)).content.decode()

    rows = [(starts, state, text(cells)) for starts, state, cells in _PRICE_ROW.findall(html)]
    assert rows == [
        (NEXT_MONTH, "future", f"{NEXT_MONTH} 0.25 0.75 EUR future Correct · Withdraw"),
        (LAST_MONTH, "in-force", f"{LAST_MONTH} 0.2 0.6 EUR in force"),
        (LAST_YEAR, "past", f"{LAST_YEAR} 0.1 0.3 EUR superseded"),
    ]
    future = priced["future"]
    assert f'href="{url("price_edit", llama.pk, future.pk)}"' in html
    assert f'href="{url("price_withdraw", llama.pk, future.pk)}"' in html
    for kept in (priced["past"], priced["in_force"]):  # history offers no change
        assert url("price_edit", llama.pk, kept.pk) not in html
        assert url("price_withdraw", llama.pk, kept.pk) not in html
    assert f'href="{url("price_new", llama.pk)}"' in html


def test_the_currency_is_the_companys(olivia, llama, priced, settings) -> None:
    settings.CURRENCY = "CHF"

    html = olivia.get(url("model_edit", llama.pk)).content.decode()

    assert [text(cells).split()[3] for _s, _st, cells in _PRICE_ROW.findall(html)] == ["CHF"] * 3


def test_a_model_without_prices_says_its_usage_has_no_price(olivia, llama) -> None:
    html = olivia.get(url("model_edit", llama.pk)).content.decode()

    assert 'id="officer-prices"' not in html
    assert "No prices yet" in text(html)


def test_the_models_list_shows_each_models_price_in_force(olivia, llama, priced) -> None:
    make_model("embed", capabilities=["embeddings"])

    html = olivia.get(url("models")).content.decode()

    now_prices = [text(dd) for dd in re.findall(r'<dd class="price-now">(.*?)</dd>', html, re.S)]
    assert now_prices == [  # by model id: embed, then llama
        "no price",
        f"0.2 in, 0.6 out per 1M tokens (EUR), since {LAST_MONTH}",
    ]


# --- adding a price ---------------------------------------------------------------------------
def test_a_first_price_is_planned_then_applied_audited_and_in_force(olivia, llama) -> None:
    """GIVEN llama without prices WHEN olivia adds one from last year (filling what read "no
    price") THEN the plan shows it, reviewing saves nothing, and applying stores it in force,
    audited under her name."""
    new_url = url("price_new", llama.pk)
    data = price_data(effective_from=LAST_YEAR, input_per_mtok="0.20", output_per_mtok="0.60")
    html = review(olivia, new_url, data)

    assert {(c.action, c.path, c.field, c.after) for c in plan_cells(html)} == {
        ("create", f"models[llama].prices[{LAST_YEAR}]", "input_per_mtok", '"0.2"'),
        ("create", f"models[llama].prices[{LAST_YEAR}]", "output_per_mtok", '"0.6"'),
    }
    assert not ModelPrice.objects.exists()  # reviewing saves nothing

    response = apply(olivia, new_url, data, html)

    assert response.status_code == 302
    assert response["Location"] == url("model_edit", llama.pk) + "#prices"
    assert stored(llama) == [(LAST_YEAR, "0.200000", "0.600000")]
    price = price_in_force(model=llama, at=timezone.now())
    assert price is not None
    assert (price.input_per_mtok, price.output_per_mtok) == (Decimal("0.2"), Decimal("0.6"))
    assert list(AuditEvent.objects.values_list("action", "actor")) == [
        ("modelprice.create", "olivia")
    ]
    page = olivia.get(response["Location"])
    assert f"Price of llama from {LAST_YEAR} saved." in text(page.content.decode())
    assert [s for s, state, _c in _PRICE_ROW.findall(page.content.decode())] == [LAST_YEAR]


def test_a_future_price_is_added_behind_the_one_in_force(olivia, llama) -> None:
    add_price(llama, LAST_MONTH, "0.2", "0.6")
    new_url = url("price_new", llama.pk)
    data = price_data(effective_from=NEXT_YEAR)
    html = review(olivia, new_url, data)

    assert {(c.action, c.path) for c in plan_cells(html)} == {
        ("create", f"models[llama].prices[{NEXT_YEAR}]")
    }
    assert apply(olivia, new_url, data, html).status_code == 302

    assert stored(llama) == [
        (LAST_MONTH, "0.200000", "0.600000"),
        (NEXT_YEAR, "0.250000", "0.750000"),
    ]
    price = price_in_force(model=llama, at=timezone.now())
    assert price is not None
    assert price.input_per_mtok == Decimal("0.2")  # not yet the new one


def test_the_new_price_form_starts_at_the_next_midnight(olivia, llama) -> None:
    response = olivia.get(url("price_new", llama.pk))

    start = response.context["form"]["effective_from"].value()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT00:00:00Z", start)
    assert timedelta(0) < datetime.fromisoformat(start) - timezone.now() <= timedelta(days=1)


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        # the history rule, from the plan: the price from last month was in force then
        (
            {"effective_from": YESTERDAY},
            "effective_from",
            f"starts in the past, while the price from {LAST_MONTH} was in force",
        ),
        # the parser: two prices cannot start at once
        ({"effective_from": LAST_MONTH}, "effective_from", f"two prices start at {LAST_MONTH}"),
        # the form: a start is a moment, with its time zone
        ({"effective_from": "2027-07-01"}, "effective_from", "must give a time zone"),
        ({"effective_from": "soon"}, "effective_from", "ISO 8601"),
        # the parser's amounts
        ({"input_per_mtok": "-1"}, "input_per_mtok", "must not be negative"),
        ({"output_per_mtok": "0.1234567"}, "output_per_mtok", "at most 6 decimal places"),
        ({"output_per_mtok": "cheap"}, "output_per_mtok", "must be a decimal amount"),
    ],
    # Fixed ids: the messages hold times taken from the clock, and every test process
    # (pytest-xdist) must collect the same names.
    ids=[
        "in-the-past",
        "same-start",
        "no-time-zone",
        "not-a-time",
        "negative",
        "too-many-decimals",
        "not-a-number",
    ],
)
def test_an_invalid_new_price_shows_the_rule_on_its_field_and_writes_nothing(
    olivia, llama, changes, field, message
) -> None:
    add_price(llama, LAST_MONTH, "0.2", "0.6")

    response = olivia.post(url("price_new", llama.pk), {**price_data(**changes), "step": "review"})

    errors = field_errors(response, field)
    assert any(message in error for error in errors), errors
    assert f'id="id_{field}_errors"' in response.content.decode()
    assert stored(llama) == [(LAST_MONTH, "0.200000", "0.600000")]
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


# --- a price in force is history ---------------------------------------------------------------
def test_changing_a_price_in_force_is_refused_on_its_start_with_the_rule(
    olivia, llama, priced
) -> None:
    in_force = priced["in_force"]
    edit_url = url("price_edit", llama.pk, in_force.pk)
    page = olivia.get(edit_url).content.decode()
    assert "This price is in force" in text(page)
    start = rf'<input type="text" name="effective_from" value="{LAST_MONTH}"[^>]* disabled'
    assert re.search(start, page)

    response = olivia.post(
        edit_url, {**price_data(effective_from=LAST_MONTH, input_per_mtok="0.1"), "step": "review"}
    )

    errors = field_errors(response, "effective_from")
    assert errors == [
        f"is in force since {LAST_MONTH}: a price in force is never changed or deleted "
        "(add a new price from now on)"
    ]
    in_force.refresh_from_db()
    assert in_force.input_per_mtok == Decimal("0.2")
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


def test_withdrawing_a_price_in_force_is_refused(olivia, llama, priced) -> None:
    in_force = priced["in_force"]

    response = olivia.post(url("price_withdraw", llama.pk, in_force.pk), {"step": "review"})

    assert response.status_code == 200
    assert response.context["form"].non_field_errors() == [
        f"This price is in force since {LAST_MONTH}: a price in force is never changed or "
        "deleted (add a new price from now on)."
    ]
    assert ModelPrice.objects.filter(pk=in_force.pk).exists()
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))


# --- a future price can be corrected or withdrawn ----------------------------------------------
def test_a_future_price_is_corrected_as_planned_and_audited(olivia, llama, priced) -> None:
    future = priced["future"]
    edit_url = url("price_edit", llama.pk, future.pk)
    assert olivia.get(edit_url).context["form"]["input_per_mtok"].value() == "0.25"
    data = price_data(effective_from="ignored: the start is fixed", input_per_mtok="0.22")
    html = review(olivia, edit_url, data)

    assert [(c.action, c.path, c.field, c.before, c.after) for c in plan_cells(html)] == [
        ("update", f"models[llama].prices[{NEXT_MONTH}]", "input_per_mtok", '"0.25"', '"0.22"')
    ]
    response = apply(olivia, edit_url, data, html)

    assert response.status_code == 302
    future.refresh_from_db()
    assert (future.input_per_mtok, future.output_per_mtok) == (Decimal("0.22"), Decimal("0.75"))
    assert list(AuditEvent.objects.values_list("action", "actor")) == [
        ("modelprice.update", "olivia")
    ]


def test_a_future_price_is_withdrawn_as_planned_and_audited(olivia, llama, priced) -> None:
    future = priced["future"]
    withdraw_url = url("price_withdraw", llama.pk, future.pk)
    page = olivia.get(withdraw_url).content.decode()
    assert f"Withdraw the price of llama from {NEXT_MONTH}" in text(page)
    html = review(olivia, withdraw_url, {})

    assert {(c.action, c.path) for c in plan_cells(html)} == {
        ("delete", f"models[llama].prices[{NEXT_MONTH}]")
    }
    assert ModelPrice.objects.filter(pk=future.pk).exists()  # reviewing saves nothing
    response = apply(olivia, withdraw_url, {}, html)

    assert response.status_code == 302
    assert stored(llama) == [
        (LAST_YEAR, "0.100000", "0.300000"),
        (LAST_MONTH, "0.200000", "0.600000"),
    ]
    assert list(AuditEvent.objects.values_list("action", "actor")) == [
        ("modelprice.delete", "olivia")
    ]


def test_a_price_of_another_model_is_not_found(olivia, llama, priced) -> None:
    other = make_model("embed", capabilities=["embeddings"])
    future = priced["future"]

    assert olivia.get(url("price_edit", other.pk, future.pk)).status_code == 404
    assert olivia.get(url("price_withdraw", other.pk, future.pk)).status_code == 404


# --- field by field (htmx) --------------------------------------------------------------------
def validate(client: Any, page_url: str, field: str, data: dict[str, object]) -> list[str]:
    response = client.post(f"{page_url}?validate={field}", data, headers={"HX-Request": "true"})
    assert response.status_code == 200, response.content
    return [text(item) for item in _ERROR_ITEM.findall(response.content.decode())]


def test_each_price_field_is_checked_as_it_is_left_and_saves_nothing(olivia, llama) -> None:
    add_price(llama, LAST_MONTH, "0.2", "0.6")
    new_url = url("price_new", llama.pk)

    assert validate(olivia, new_url, "effective_from", price_data(effective_from=YESTERDAY)) == [
        f"starts in the past, while the price from {LAST_MONTH} was in force: it would "
        "reprice usage already priced (start it now or later)"
    ]
    assert validate(olivia, new_url, "input_per_mtok", price_data(input_per_mtok="-1")) == [
        "must not be negative"
    ]
    assert validate(olivia, new_url, "effective_from", price_data()) == []
    assert validate(olivia, new_url, "input_per_mtok", price_data()) == []
    assert olivia.post(f"{new_url}?validate=nope", price_data()).status_code == 400
    assert stored(llama) == [(LAST_MONTH, "0.200000", "0.600000")]
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))

    html = olivia.get(new_url).content.decode()
    for name in ("effective_from", "input_per_mtok", "output_per_mtok"):
        tag = re.search(rf'<input type="text" name="{name}"[^>]*>', html)
        assert tag, name
        assert f'hx-post="{new_url}?validate={name}"' in tag.group(0)
        assert f'aria-describedby="id_{name}_helptext id_{name}_errors"' in tag.group(0)


# --- only officers ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("username", "role"),
    [("alice", Role.DEVELOPER), ("audrey", Role.AUDITOR), ("mallory", None)],
)
def test_only_officers_may_set_prices(llama, priced, username, role) -> None:
    client = client_for(username, *([role] if role else []))
    future = priced["future"]
    before = stored(llama)
    targets = [
        (url("price_new", llama.pk), price_data(effective_from=NEXT_YEAR)),
        (url("price_edit", llama.pk, future.pk), price_data(input_per_mtok="0")),
        (url("price_withdraw", llama.pk, future.pk), {}),
    ]
    for target, data in targets:
        assert client.get(target).status_code == 403
        assert client.post(target, {**data, "step": "apply"}).status_code == 403
        assert client.post(f"{target}?validate=input_per_mtok", data).status_code == 403
    assert stored(llama) == before
    assert not AuditEvent.objects.exists(), list(AuditEvent.objects.values_list("actor", "action"))
