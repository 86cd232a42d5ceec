"""Model prices: their values, their history, policy as code and the API.

Priya is the platform engineer whose CI applies the policy file; olivia is a governance
officer and alice a developer. A price applies from its start until the model's next one;
what is already in force is history and is never rewritten.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
import yaml
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management import call_command
from rest_framework.test import APIClient

from governance.audit import Actor, audit_verify
from governance.models import AuditEvent, Model, ModelPrice
from governance.policy_as_code.apply import policy_apply
from governance.policy_as_code.errors import PolicyInvalid
from governance.policy_as_code.export import policy_export
from governance.policy_as_code.plan import Action, Section, plan_build
from governance.policy_as_code.render import plan_json, plan_text
from governance.policy_as_code.schema import policy_parse
from governance.policy_as_code.selectors import policy_current
from governance.prices import (
    Price,
    PriceError,
    PriceTable,
    model_price_add,
    model_price_delete,
    model_price_update,
    money_text,
    price_amount,
    price_in_force,
    price_moment,
)
from governance.roles import Role
from testkit.factories import make_model, make_tenant, make_user

pytestmark = pytest.mark.django_db

PRIYA = Actor(username="priya", is_system=True)
NOW = datetime.now(UTC).replace(microsecond=0)
LAST_YEAR = "2025-01-01T00:00:00Z"
LAST_MONTH = (NOW - timedelta(days=30)).isoformat().replace("+00:00", "Z")
NEXT_MONTH = (NOW + timedelta(days=30)).isoformat().replace("+00:00", "Z")


def at(text: str) -> datetime:
    return price_moment(text)


def policy(prices: list[dict[str, Any]] | None) -> dict[str, Any]:
    """One model, with the prices given (None: the file says nothing of prices)."""
    model: dict[str, Any] = {
        "id": "llama",
        "capabilities": ["chat"],
        "deployments": [{"served_name": "llama-8b", "replicas": ["http://10.0.0.1:8000"]}],
    }
    if prices is not None:
        model["prices"] = prices
    return {"version": 1, "models": [model]}


def apply(data: dict[str, Any], **options: bool):
    return policy_apply(document=policy_parse(data), actor=PRIYA, **options)


def plan(data: dict[str, Any], **options: Any):
    return plan_build(policy_parse(data), policy_current(), **options)


def problems_of(data: dict[str, Any]) -> list[str]:
    with pytest.raises(PolicyInvalid) as caught:
        plan(data)
    return [str(p) for p in caught.value.problems]


def stored() -> list[tuple[str, Decimal, Decimal]]:
    return [
        (p.effective_from.astimezone(UTC).isoformat(), p.input_per_mtok, p.output_per_mtok)
        for p in ModelPrice.objects.order_by("effective_from")
    ]


# --- values --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("0.50", Decimal("0.5")),
        (3, Decimal(3)),
        (0.1, Decimal("0.1")),  # a YAML float is the digits written, not 0.1000000000000000055…
        (Decimal("12.345678"), Decimal("12.345678")),
        ("0", Decimal(0)),
    ],
)
def test_a_price_is_read_as_the_exact_decimal_written(given: Any, expected: Decimal) -> None:
    amount = price_amount(given)
    assert amount == expected
    assert isinstance(amount, Decimal)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("-0.01", "must not be negative"),
        (-1, "must not be negative"),
        (True, "must be a decimal amount"),
        ("ten", "must be a decimal amount"),
        ("NaN", "must be a decimal amount"),
        (float("inf"), "must be a finite amount"),
        ("0.0000001", "at most 6 decimal places"),
        ("1000000000000", r"must be less than 10\^12"),
    ],
)
def test_a_bad_price_is_refused_with_the_reason(given: Any, message: str) -> None:
    with pytest.raises(PriceError, match=message):
        price_amount(given)


def test_a_start_is_a_moment_with_a_time_zone_kept_in_utc() -> None:
    assert price_moment("2026-01-01T01:00:00+01:00") == datetime(2026, 1, 1, tzinfo=UTC)
    assert price_moment("2026-01-01T00:00:00Z") == datetime(2026, 1, 1, tzinfo=UTC)
    for bad, message in (
        ("2026-01-01T00:00:00", "must give a time zone"),
        (datetime(2026, 1, 1), "must give a time zone"),
        (date(2026, 1, 1), "a date and time with a time zone"),
        ("next tuesday", "ISO 8601"),
        (20260101, "ISO 8601"),
        ("0001-01-01T00:00:00+01:00", "out of the range of dates"),
    ):
        with pytest.raises(PriceError, match=message):
            price_moment(bad)


def test_money_is_shown_to_the_cent_half_up_and_a_fraction_of_a_cent_keeps_its_digits() -> None:
    assert money_text(Decimal("2.605")) == "2.61"
    assert money_text(Decimal("1234567.5")) == "1,234,567.50"
    assert money_text(Decimal("0.000525")) == "0.000525"
    assert money_text(Decimal(0)) == "0.00"


# --- history -------------------------------------------------------------------------------
def test_the_price_in_force_is_the_latest_that_started_at_or_before_the_moment() -> None:
    march, april = at("2026-03-01T00:00:00Z"), at("2026-04-01T00:00:00Z")
    table = PriceTable(
        [
            ("llama", Price(april, Decimal("1"), Decimal("2"))),
            ("llama", Price(march, Decimal("3"), Decimal("4"))),
        ]
    )

    assert table.at("llama", march - timedelta(seconds=1)) is None  # before any: no price
    assert table.at("llama", march).input_per_mtok == Decimal("3")  # from its start
    assert table.at("llama", april - timedelta(microseconds=1)).input_per_mtok == Decimal("3")
    assert table.at("llama", april).input_per_mtok == Decimal("1")
    assert table.at("llama", april + timedelta(days=900)).input_per_mtok == Decimal("1")
    assert table.at("mistral", april) is None


def test_spend_is_exact_per_million_tokens() -> None:
    price = Price(at(LAST_YEAR), Decimal("0.15"), Decimal("0.60"))
    assert price.spend(prompt_tokens=1_234_567, completion_tokens=89) == Decimal("0.18523845")


def test_an_officer_adds_prices_and_the_one_in_force_is_looked_up_by_moment() -> None:
    llama = make_model("llama")
    olivia = Actor.for_user(make_user("olivia", Role.OFFICER))

    model_price_add(
        actor=olivia,
        model=llama,
        effective_from="2025-01-01T00:00:00Z",
        input_per_mtok="0.50",
        output_per_mtok="1.50",
    )
    model_price_add(
        actor=olivia,
        model=llama,
        effective_from=NEXT_MONTH,
        input_per_mtok="0.40",
        output_per_mtok="1.20",
    )

    now_price = price_in_force(model=llama, at=NOW)
    assert now_price is not None
    assert now_price.output_per_mtok == Decimal("1.5")
    later = price_in_force(model="llama", at=at(NEXT_MONTH) + timedelta(hours=1))
    assert later is not None
    assert later.input_per_mtok == Decimal("0.4")
    assert price_in_force(model=llama, at=at("2024-12-31T23:59:59Z")) is None
    events = AuditEvent.objects.filter(action="modelprice.create").order_by("sequence")
    assert [(e.actor, (e.after or {})["input_per_mtok"]) for e in events] == [
        ("olivia", "0.500000"),
        ("olivia", "0.400000"),
    ]
    assert audit_verify().ok


def test_a_price_in_force_is_never_changed_or_deleted_but_a_future_one_may_be() -> None:
    llama = make_model("llama")
    past = model_price_add(
        actor=PRIYA, model=llama, effective_from=LAST_YEAR, input_per_mtok=1, output_per_mtok=2
    )
    future = model_price_add(
        actor=PRIYA, model=llama, effective_from=NEXT_MONTH, input_per_mtok=1, output_per_mtok=2
    )

    with pytest.raises(ValidationError, match="is in force since 2025-01-01T00:00:00Z"):
        model_price_update(actor=PRIYA, price=past, input_per_mtok=9, output_per_mtok=9)
    with pytest.raises(ValidationError, match="a price in force is never changed or deleted"):
        model_price_delete(actor=PRIYA, price=past)
    model_price_update(actor=PRIYA, price=future, input_per_mtok="0.9", output_per_mtok=2)
    assert ModelPrice.objects.get(pk=future.pk).input_per_mtok == Decimal("0.9")
    model_price_delete(actor=PRIYA, price=future)

    assert stored() == [("2025-01-01T00:00:00+00:00", Decimal(1), Decimal(2))]
    assert [e.action for e in AuditEvent.objects.order_by("sequence")][-2:] == [
        "modelprice.update",
        "modelprice.delete",
    ]


def test_a_backdated_price_may_fill_the_time_before_the_first_price_only() -> None:
    llama = make_model("llama")
    model_price_add(
        actor=PRIYA, model=llama, effective_from=LAST_MONTH, input_per_mtok=1, output_per_mtok=1
    )

    # Before the first price there was none: filling it reprices nothing already priced.
    model_price_add(
        actor=PRIYA, model=llama, effective_from=LAST_YEAR, input_per_mtok=2, output_per_mtok=2
    )
    # After it, usage was priced: a price starting in the past would change that.
    with pytest.raises(ValidationError, match="would reprice usage already priced"):
        model_price_add(
            actor=PRIYA,
            model=llama,
            effective_from=NOW - timedelta(days=1),
            input_per_mtok=3,
            output_per_mtok=3,
        )
    with pytest.raises(ValidationError, match="already has a price from"):
        model_price_add(
            actor=PRIYA,
            model=llama,
            effective_from="2025-01-01T01:00:00+01:00",  # the same moment, written otherwise
            input_per_mtok=3,
            output_per_mtok=3,
        )
    assert len(stored()) == 2


def test_bad_amounts_are_refused_field_by_field_and_a_developer_may_not_set_prices() -> None:
    llama = make_model("llama")
    with pytest.raises(ValidationError) as caught:
        model_price_add(
            actor=PRIYA, model=llama, effective_from=NEXT_MONTH, input_per_mtok="-1",
            output_per_mtok="x",
        )  # fmt: skip
    assert set(caught.value.message_dict) == {"input_per_mtok", "output_per_mtok"}
    alice = Actor.for_user(make_user("alice", Role.DEVELOPER, tenants=(make_tenant("acme"),)))
    with pytest.raises(PermissionDenied):
        model_price_add(
            actor=alice, model=llama, effective_from=NEXT_MONTH, input_per_mtok=1,
            output_per_mtok=1,
        )  # fmt: skip
    assert stored() == []


# --- policy as code: the file ----------------------------------------------------------------
def test_a_file_with_bad_prices_reports_every_problem_at_its_place() -> None:
    entries: list[Any] = [
        {"from": "2026-01-01T00:00:00", "input_per_mtok": "-1", "output_per_mtok": 1},
        {"from": "2026-02-01T00:00:00Z", "input_per_mtok": 1, "output_per_mtok": 2},
        {"from": "2026-02-01T01:00:00+01:00", "input_per_mtok": 1, "output_per_mtok": 1},
        {"from": "2026-03-01T00:00:00Z", "input_per_mtok": 1, "output_per_mtok": 1, "x": 1},
        {"from": "2026-04-01T00:00:00Z", "input_per_mtok": 1},
        "free",
    ]
    problems = problems_of(policy(entries))

    assert problems == [
        "models[llama].prices[0].from: must give a time zone, e.g. 2026-01-01T00:00:00Z or +01:00",
        "models[llama].prices[0].input_per_mtok: must not be negative",
        "models[llama].prices[3]: unknown field 'x'",
        "models[llama].prices[4].output_per_mtok: is required",
        "models[llama].prices[5]: must be a mapping",
        "models[llama].prices: two prices start at 2026-02-01T00:00:00Z",
    ]


def test_an_unquoted_yaml_timestamp_and_a_float_read_as_written() -> None:
    text = (
        "version: 1\nmodels:\n  - id: llama\n    capabilities: [chat]\n"
        "    prices:\n      - {from: 2026-01-01T00:00:00Z, input_per_mtok: 0.1, "
        "output_per_mtok: 0.3}\n"
    )
    document = policy_parse(yaml.safe_load(text))
    assert document.models is not None
    assert document.models[0].prices == (
        Price(at("2026-01-01T00:00:00Z"), Decimal("0.1"), Decimal("0.3")),
    )


# --- policy as code: plan, apply, export ----------------------------------------------------
def test_prices_are_planned_applied_audited_and_applying_again_does_nothing() -> None:
    data = policy(
        [
            {"from": LAST_YEAR, "input_per_mtok": "0.50", "output_per_mtok": "1.50"},
            {"from": NEXT_MONTH, "input_per_mtok": "0.40", "output_per_mtok": 1},
        ]
    )

    planned = plan(data)
    prices = planned.of(Section.MODEL_PRICES, Action.CREATE)
    assert [c.path for c in prices] == [
        f"models[llama].prices[{LAST_YEAR}]",
        f"models[llama].prices[{NEXT_MONTH}]",
    ]
    assert prices[0].after == {"input_per_mtok": "0.5", "output_per_mtok": "1.5"}
    text = plan_text(planned)
    assert f"  + create  models[llama].prices[{LAST_YEAR}]\n" in text
    assert '        input_per_mtok: "0.5"\n' in text
    assert plan_json(planned)["changes"][2]["fields"]["output_per_mtok"]["after"] == "1.5"

    apply(data)

    assert stored() == [
        ("2025-01-01T00:00:00+00:00", Decimal("0.5"), Decimal("1.5")),
        (at(NEXT_MONTH).isoformat(), Decimal("0.4"), Decimal(1)),
    ]
    assert AuditEvent.objects.filter(action="modelprice.create", actor="priya").count() == 2
    assert not plan(data).has_changes
    assert not apply(data).plan.has_changes


def test_changing_a_price_in_force_is_refused_and_a_new_price_from_now_on_is_the_way() -> None:
    apply(policy([{"from": LAST_YEAR, "input_per_mtok": 1, "output_per_mtok": 2}]))

    assert problems_of(
        policy([{"from": LAST_YEAR, "input_per_mtok": 5, "output_per_mtok": 2}])
    ) == [
        f"models[llama].prices[{LAST_YEAR}]: is in force since {LAST_YEAR}: a price in force is "
        "never changed or deleted (add a new price from now on)"
    ]
    assert problems_of(
        policy(
            [
                {"from": LAST_YEAR, "input_per_mtok": 1, "output_per_mtok": 2},
                {"from": LAST_MONTH, "input_per_mtok": 5, "output_per_mtok": 2},
            ]
        )
    ) == [
        f"models[llama].prices[{LAST_MONTH}]: starts in the past, while the price from "
        f"{LAST_YEAR} was in force: it would reprice usage already priced (start it now or later)"
    ]
    # A file that lists only the new price keeps the one in force, and says so.
    newer = policy([{"from": NEXT_MONTH, "input_per_mtok": 5, "output_per_mtok": 2}])
    result = apply(newer, prune=True)
    assert [n.message for n in result.plan.notes] == [
        "not in the file; kept, since it is in force (prices in force are history)"
    ]
    assert [row[0] for row in stored()] == ["2025-01-01T00:00:00+00:00", at(NEXT_MONTH).isoformat()]


def test_a_future_price_left_out_is_kept_without_prune_and_withdrawn_with_it() -> None:
    apply(
        policy(
            [
                {"from": LAST_YEAR, "input_per_mtok": 1, "output_per_mtok": 2},
                {"from": NEXT_MONTH, "input_per_mtok": 3, "output_per_mtok": 4},
            ]
        )
    )
    only_past = policy([{"from": LAST_YEAR, "input_per_mtok": 1, "output_per_mtok": 2}])

    kept = apply(only_past)
    assert [n.message for n in kept.plan.notes] == [
        "not in the file; kept (apply --prune deletes it)"
    ]
    assert len(stored()) == 2
    pruned = apply(only_past, prune=True)
    assert [(c.action, c.path) for c in pruned.plan.changes] == [
        (Action.DELETE, f"models[llama].prices[{NEXT_MONTH}]")
    ]
    assert len(stored()) == 1
    assert AuditEvent.objects.filter(action="modelprice.delete").count() == 1


def test_a_file_that_says_nothing_of_prices_leaves_them_alone() -> None:
    apply(policy([{"from": NEXT_MONTH, "input_per_mtok": 1, "output_per_mtok": 2}]))

    result = apply(policy(None), prune=True)

    assert not result.plan.has_changes
    assert result.plan.notes == ()
    assert len(stored()) == 1


def test_an_export_writes_the_prices_and_planning_it_shows_no_change(tmp_path) -> None:
    apply(
        policy(
            [
                {
                    "from": "2025-01-01T01:00:00+01:00",
                    "input_per_mtok": "0.50",
                    "output_per_mtok": 2,
                },
                {"from": NEXT_MONTH, "input_per_mtok": "0.000001", "output_per_mtok": "100"},
            ]
        )
    )
    make_model("mistral")  # no price: exported without a prices key

    text = policy_export()
    path = tmp_path / "export.yaml"
    path.write_text(text)
    stdout = StringIO()
    call_command("policy", "plan", str(path), "--prune", stdout=stdout, stderr=StringIO())

    assert stdout.getvalue() == "No changes: the database matches the file.\n"
    assert (
        "    prices:\n"
        "      - {from: '2025-01-01T00:00:00Z', input_per_mtok: '0.5', output_per_mtok: '2'}\n"
        f"      - {{from: '{NEXT_MONTH}', input_per_mtok: '0.000001', output_per_mtok: '100'}}\n"
    ) in text
    exported = yaml.safe_load(text)["models"]
    assert [("prices" in m) for m in exported] == [True, False]  # llama, mistral


# --- the API ---------------------------------------------------------------------------------
def test_the_model_catalogue_shows_each_price_with_its_currency(settings) -> None:
    settings.CURRENCY = "CHF"
    llama = make_model("llama")
    model_price_add(
        actor=PRIYA, model=llama, effective_from=NEXT_MONTH, input_per_mtok="0.4",
        output_per_mtok=1,
    )  # fmt: skip
    model_price_add(
        actor=PRIYA, model=llama, effective_from=LAST_YEAR, input_per_mtok="0.5",
        output_per_mtok="1.5",
    )  # fmt: skip
    client = APIClient()
    client.force_authenticate(make_user("alice", Role.DEVELOPER, tenants=(make_tenant("acme"),)))

    response = client.get("/api/models/llama/")

    assert response.status_code == 200
    assert response.json()["prices"] == [
        {
            "effective_from": "2025-01-01T00:00:00Z",
            "input_per_mtok": "0.500000",
            "output_per_mtok": "1.500000",
            "currency": "CHF",
        },
        {
            "effective_from": at(NEXT_MONTH).isoformat().replace("+00:00", "Z"),
            "input_per_mtok": "0.400000",
            "output_per_mtok": "1.000000",
            "currency": "CHF",
        },
    ]
    # Read-only there: a price sent with a model is not taken (policy as code sets prices).
    olivia = APIClient()
    olivia.force_authenticate(make_user("olivia", Role.OFFICER))
    changed = olivia.patch(
        "/api/models/llama/",
        {"prices": [{"effective_from": LAST_YEAR, "input_per_mtok": "9"}]},
        format="json",
    )
    assert changed.status_code == 200
    assert ModelPrice.objects.filter(model=Model.objects.get(public_id="llama")).count() == 2


def test_two_prices_of_a_model_starting_together_cannot_be_stored() -> None:
    llama = make_model("llama")
    ModelPrice.objects.create(
        model=llama, effective_from=at(LAST_YEAR), input_per_mtok=1, output_per_mtok=1
    )
    duplicate = ModelPrice(
        model=llama,
        effective_from=datetime(2025, 1, 1, 2, tzinfo=timezone(timedelta(hours=2))),
        input_per_mtok=1,
        output_per_mtok=1,
    )
    with pytest.raises(ValidationError, match="already exists"):
        duplicate.full_clean()


def test_an_officer_adds_a_price_through_the_api_and_a_developer_may_not() -> None:
    make_model("llama")
    olivia, alice = APIClient(), APIClient()
    olivia.force_authenticate(make_user("olivia", Role.OFFICER))
    alice.force_authenticate(make_user("alice", Role.DEVELOPER, tenants=(make_tenant("acme"),)))
    body = {"effective_from": LAST_YEAR, "input_per_mtok": "0.25", "output_per_mtok": "1"}

    refused = alice.post("/api/models/llama/prices/", body, format="json")
    added = olivia.post("/api/models/llama/prices/", body, format="json")
    naive = olivia.post(
        "/api/models/llama/prices/",
        {**body, "effective_from": "2030-01-01T00:00:00"},
        format="json",
    )
    backdated = olivia.post(
        "/api/models/llama/prices/", {**body, "effective_from": LAST_MONTH}, format="json"
    )
    negative = olivia.post(
        "/api/models/llama/prices/", {**body, "input_per_mtok": "-1"}, format="json"
    )

    assert refused.status_code == 403
    assert added.status_code == 201
    assert added.json() == {
        "effective_from": "2025-01-01T00:00:00Z",
        "input_per_mtok": "0.250000",
        "output_per_mtok": "1.000000",
        "currency": "EUR",
    }
    assert naive.status_code == 400
    assert naive.json()["effective_from"] == [
        "must give a time zone, e.g. 2026-01-01T00:00:00Z or +01:00"
    ]
    assert backdated.status_code == 400
    assert "would reprice usage already priced" in backdated.json()["effective_from"][0]
    assert negative.status_code == 400
    assert list(negative.json()) == ["input_per_mtok"]
    assert stored() == [("2025-01-01T00:00:00+00:00", Decimal("0.25"), Decimal(1))]
    assert AuditEvent.objects.get(action="modelprice.create").actor == "olivia"
