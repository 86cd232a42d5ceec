"""Spend on a use case's charts, its CSV and My usage: the persisted usage roll-ups priced
with the price in force when the tokens were used.

Personas: alice is a developer of tenant acme, olivia a governance officer. The usage rows are
the persister's roll-ups written straight into the test database; the pages' clock is pinned
to NOW. llama's price changes at 13:30 today, inside the 13:00 bucket; mistral has no price.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.test import Client

from governance.audit import Actor
from governance.models import UseCase
from governance.prices import model_price_add
from governance.roles import Role
from portal.charts import views as usage_views
from portal.charts.series import RANGES, chart_named, use_case_charts
from portal.charts.spend import usage_priced
from records.models import UsageMinute
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 10, 14, 25, tzinfo=UTC)  # 24 h buckets: 15:00 yesterday … 14:00
TODAY = NOW.replace(hour=0, minute=0)
PRIYA = Actor(username="priya", is_system=True)


@dataclass
class World:
    chatbot: UseCase
    alice: Client
    olivia: Client


def _usage(use_case: UseCase, model: str, minute: datetime, prompt: int, completion: int) -> None:
    UsageMinute.objects.create(
        use_case_id=use_case.pk,
        tenant=use_case.tenant.slug,
        model=model,
        minute=minute,
        requests=1,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, settings, valkey_url: str) -> World:
    settings.VALKEY_URL = valkey_url
    monkeypatch.setattr(usage_views, "now", lambda: NOW)
    acme, globex = make_tenant("acme"), make_tenant("globex")
    llama, mistral = make_model("llama"), make_model("mistral")
    chatbot = make_use_case(acme, "chatbot", models=(llama, mistral))
    search = make_use_case(globex, "search", models=(llama,))
    # llama: 2.00 / 6.00 per million from 1 March, 1.00 / 3.00 from 13:30 today (set ahead
    # of time, as a price must be: it was in the future when it was set).
    for start, price_in, price_out in (
        ("2026-03-01T00:00:00Z", "2.00", "6.00"),
        ("2026-03-10T14:30:00+01:00", "1.00", "3.00"),
    ):
        model_price_add(
            actor=PRIYA,
            model=llama,
            effective_from=start,
            input_per_mtok=price_in,
            output_per_mtok=price_out,
            now=datetime(2026, 2, 1, tzinfo=UTC),
        )
    at = TODAY.replace
    # 12:10 at the first price: 1,000 × 2 + 500 × 6 = 5,000 per million = 0.005
    _usage(chatbot, "llama", at(hour=12, minute=10), 1_000, 500)
    # 13:10 at the first price: 200,000 × 2 + 100,000 × 6 = 1.00
    _usage(chatbot, "llama", at(hour=13, minute=10), 200_000, 100_000)
    # 13:30, the minute the new price starts: 300,000 × 1 + 100,000 × 3 = 0.60
    _usage(chatbot, "llama", at(hour=13, minute=30), 300_000, 100_000)
    # 14:05 at the new price: 1,000,000 × 1 = 1.00
    _usage(chatbot, "llama", at(hour=14, minute=5), 1_000_000, 0)
    # mistral has no price: 1,000 tokens with no spend, never counted as 0
    _usage(chatbot, "mistral", at(hour=14, minute=5), 700, 300)
    # 20 February, before llama's first price: no price (30-day range only; not this month)
    _usage(chatbot, "llama", datetime(2026, 2, 20, 10, tzinfo=UTC), 5_000, 0)
    # Another tenant's use case: never on acme's charts
    _usage(search, "llama", at(hour=14), 9_000_000, 9_000_000)
    return World(
        chatbot=chatbot,
        alice=_client_for(make_user("alice", Role.DEVELOPER, tenants=(acme,))),
        olivia=_client_for(make_user("olivia", Role.OFFICER)),
    )


def _spend(response):
    chart = chart_named(response.context["charts"], "spend")
    assert chart is not None
    return chart


def test_each_minute_is_priced_at_the_price_in_force_then_even_mid_bucket(world: World) -> None:
    spend = _spend(world.olivia.get(f"/use-cases/{world.chatbot.pk}/usage/?range=24h"))

    assert spend.unit == "EUR"
    assert [s.label for s in spend.series] == ["llama"]  # mistral: no price, nothing to draw
    llama = spend.series[0].values
    assert len(llama) == 24
    assert list(llama[-3:]) == [Decimal("0.005"), Decimal("1.60"), Decimal("1.00")]
    assert all(v == 0 for v in llama[:-3])
    assert spend.total == Decimal("2.605")
    assert spend.total_text == "2.61"
    assert spend.notice == (
        "No price was in force for some usage, which is not in the amounts: mistral (1,000 tokens)."
    )


def test_the_page_shows_the_total_the_notice_and_amounts_for_the_tooltip(world: World) -> None:
    response = world.olivia.get(f"/use-cases/{world.chatbot.pk}/usage/")
    html = response.content.decode()

    assert (
        '<p data-total="spend">Total for the last 24 hours: <strong>2.61 EUR</strong> '
        "(usage with a price only)</p>"
    ) in html
    assert '<p class="callout" data-notice="spend">No price was in force' in html
    assert '<canvas data-chart="chart-spend-data"' in html
    assert '<script id="chart-spend-data" type="application/json">' in html
    config = _spend(response).config()
    assert config["currency"] == "EUR"
    assert config["datasets"][0]["data"][-3:] == ["0.005", "1.6", "1"]  # exact, as strings
    assert config["datasets"][0]["display"][-3:] == ["0.005", "1.60", "1.00"]  # as the table
    assert '<td class="num">1.60</td>' in html


def test_the_spend_csv_has_a_column_per_model_in_the_currency_with_exact_amounts(
    world: World, settings
) -> None:
    settings.CURRENCY = "CHF"
    response = world.alice.get(f"/use-cases/{world.chatbot.pk}/usage/spend.csv?range=24h")

    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="acme-chatbot-spend-24h.csv"'
    lines = response.content.decode().splitlines()
    assert lines[0] == "bucket_start_utc,llama (CHF)"
    assert lines[1] == "2026-03-09T15:00:00Z,0"
    assert lines[-3:] == [
        "2026-03-10T12:00:00Z,0.005",
        "2026-03-10T13:00:00Z,1.6",
        "2026-03-10T14:00:00Z,1",
    ]


def test_usage_before_the_first_price_reads_no_price_not_zero(world: World) -> None:
    response = world.alice.get(f"/use-cases/{world.chatbot.pk}/usage/?range=30d")
    spend = _spend(response)

    llama = spend.series[0].values
    february_20 = [s.date() for s in spend.starts].index(datetime(2026, 2, 20).date())
    assert llama[february_20] is None
    assert llama[-1] == Decimal("2.605")
    assert sum(1 for v in llama if v is None) == 1
    assert spend.notice.endswith("llama (5,000 tokens), mistral (1,000 tokens).")
    assert '<td class="num">no price</td>' in response.content.decode()
    csv_lines = (
        world.alice.get(f"/use-cases/{world.chatbot.pk}/usage/spend.csv?range=30d")
        .content.decode()
        .splitlines()
    )
    assert "2026-02-20T00:00:00Z,no price" in csv_lines


def test_a_use_case_whose_models_have_no_price_says_so_instead_of_zero(world: World) -> None:
    quiet = make_use_case(world.chatbot.tenant, "drafts")
    _usage(quiet, "mistral", NOW.replace(minute=0), 40, 2)

    response = world.alice.get(f"/use-cases/{quiet.pk}/usage/")
    html = response.content.decode()

    spend = _spend(response)
    assert spend.series == []
    assert '<canvas data-chart="chart-spend-data"' not in html
    assert 'data-total="spend"' not in html
    assert (
        '<p class="callout" data-notice="spend">No price was in force for some usage, which is '
        "not in the amounts: mistral (42 tokens).</p>"
    ) in html


def test_the_spend_takes_two_queries_whatever_the_range(
    world: World, django_assert_num_queries
) -> None:
    usage = UsageMinute.objects.filter(use_case_id=world.chatbot.pk)
    with django_assert_num_queries(2):  # the sums per group, model and price; the prices
        parts = usage_priced(usage, ("use_case_id",))
    assert sorted((p.model, p.tokens, p.amount) for p in parts) == [
        ("llama", 5_000, None),
        ("llama", 301_500, Decimal("1.005")),
        ("llama", 1_400_000, Decimal("1.6")),
        ("mistral", 1_000, None),
    ]
    with django_assert_num_queries(6 + 1):  # tokens 1, spend 2, refusals 1, findings 1, waits 2
        use_case_charts(world.chatbot.pk, RANGES["30d"], NOW)
    with django_assert_num_queries(6 + 1):
        use_case_charts(world.chatbot.pk, RANGES["24h"], NOW)


def test_my_usage_shows_what_each_use_case_spent_this_month(world: World) -> None:
    response = world.alice.get("/my-usage/")
    html = response.content.decode()

    assert response.status_code == 200
    assert (
        f'<p data-spend="{world.chatbot.pk}"><strong>2.61 EUR</strong> since 1 March 2026 (UTC)'
    ) in html
    assert (
        f'<p data-unpriced="{world.chatbot.pk}">Not included, having no price in force: '
        "<code>mistral</code> (1000 tokens).</p>"
    ) in html
    entry = response.context["entries"][0]
    assert entry["spend"].amount == Decimal("2.605")  # 20 February is last month


def test_my_usage_says_no_price_or_nothing_used_rather_than_zero(world: World) -> None:
    unpriced = make_use_case(world.chatbot.tenant, "drafts")
    make_use_case(world.chatbot.tenant, "idle")
    _usage(unpriced, "mistral", TODAY, 10, 5)

    html = world.alice.get("/my-usage/").content.decode()

    assert (
        f'<p data-unpriced="{unpriced.pk}"><strong>No price</strong> is set for what it used '
        "this month: <code>mistral</code> (15 tokens).</p>"
    ) in html
    assert f'data-spend="{unpriced.pk}"' not in html
    assert html.count("Nothing used this month.") == 1  # idle
