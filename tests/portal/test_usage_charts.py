"""A use case's usage charts: tokens, refusals by reason, guardrail findings, queue waits.

Personas: alice is a developer of tenant acme, bob a developer of tenant globex, olivia a
governance officer, audrey an auditor, mallory has an account and no role. The rows are the
persister's roll-ups, written straight into the test database; the page's clock is pinned to
NOW so that every bucket is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from governance.models import UseCase
from governance.roles import Role
from portal.charts import views as usage_views
from records.models import AdmissionDecision, GuardrailHour, UsageMinute
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 10, 14, 25, 0, tzinfo=UTC)  # the 24 h buckets: 15:00 the day before … 14:00
HOUR = timedelta(hours=1)
TPM = "rate_limit:use case chatbot tokens per minute"


@dataclass
class World:
    chatbot: UseCase
    search: UseCase
    alice: Client
    bob: Client
    olivia: Client
    audrey: Client
    mallory: Client


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _usage(use_case: UseCase, minute: datetime, **values: int) -> None:
    UsageMinute.objects.create(
        use_case_id=use_case.pk, tenant=use_case.tenant.slug, model="llama", minute=minute, **values
    )


_decisions = iter(range(1, 10_000))


def _decision(use_case: UseCase, at: datetime, decision: str, reason: str = "", **values: int):
    n = next(_decisions)
    AdmissionDecision.objects.create(
        stream_id=f"{n}-0",
        request_id=f"req-{n}",
        occurred_at=at,
        decision=decision,
        reason=reason,
        tenant=use_case.tenant.slug,
        tenant_id=use_case.tenant_id,
        use_case_id=use_case.pk,
        model="llama",
        **values,
    )


def _findings(use_case: UseCase, hour: datetime, guardrail: str, action: str, n: int) -> None:
    GuardrailHour.objects.create(
        use_case_id=use_case.pk,
        tenant_id=use_case.tenant_id,
        tenant=use_case.tenant.slug,
        guardrail=guardrail,
        action=action,
        hour=hour,
        findings=n,
    )


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setattr(usage_views, "now", lambda: NOW)
    acme, globex = make_tenant("acme"), make_tenant("globex")
    llama = make_model("llama")
    chatbot = make_use_case(acme, "chatbot", models=(llama,))
    search = make_use_case(globex, "search", models=(llama,))
    this_hour = NOW.replace(minute=0)
    # Tokens: two minutes in the current hour, one two hours ago, one 3 days ago (7 d only),
    # and globex's traffic, which must never show on acme's charts.
    _usage(
        chatbot,
        this_hour + timedelta(minutes=3),
        requests=4,
        prompt_tokens=100,
        completion_tokens=40,
        queued_ms=200,
    )
    _usage(
        chatbot,
        this_hour + timedelta(minutes=20),
        requests=6,
        prompt_tokens=50,
        completion_tokens=10,
        queued_ms=1_300,
    )
    _usage(
        chatbot,
        this_hour - 2 * HOUR + timedelta(minutes=59),
        requests=3,
        prompt_tokens=7,
        completion_tokens=5,
        queued_ms=0,
    )
    _usage(chatbot, NOW - timedelta(days=3), requests=1, prompt_tokens=1_000, completion_tokens=1)
    _usage(search, this_hour, requests=9, prompt_tokens=9_999, completion_tokens=9_999)
    # Refusals: two over the token limit this hour, one max-concurrent two hours ago, one
    # shed; a queue wait and an admission that are not refusals; globex's refusal.
    _decision(chatbot, this_hour + timedelta(minutes=1), "rejected", TPM)
    _decision(chatbot, this_hour + timedelta(minutes=2), "rejected", TPM)
    _decision(chatbot, this_hour - 2 * HOUR, "rejected", "max_concurrent_exceeded")
    _decision(chatbot, this_hour - HOUR + timedelta(seconds=1), "shed", "queue_timeout")
    _decision(chatbot, this_hour + timedelta(minutes=4), "queued", "prod", queued_ms=900)
    _decision(chatbot, this_hour + timedelta(minutes=5), "queued", "prod", queued_ms=2_400)
    _decision(chatbot, this_hour + timedelta(minutes=6), "admitted")
    _decision(search, this_hour, "rejected", TPM)
    # Findings: pii redacted twice an hour ago, once now; a block now; 25 hours ago (out).
    _findings(chatbot, this_hour - HOUR, "pii", "redact", 2)
    _findings(chatbot, this_hour, "pii", "redact", 1)
    _findings(chatbot, this_hour, "prompt_injection", "block", 3)
    _findings(chatbot, this_hour - 25 * HOUR, "pii", "redact", 50)
    _findings(search, this_hour, "pii", "redact", 7)
    return World(
        chatbot=chatbot,
        search=search,
        alice=_client_for(make_user("alice", Role.DEVELOPER, tenants=(acme,))),
        bob=_client_for(make_user("bob", Role.DEVELOPER, tenants=(globex,))),
        olivia=_client_for(make_user("olivia", Role.OFFICER)),
        audrey=_client_for(make_user("audrey", Role.AUDITOR)),
        mallory=_client_for(make_user("mallory")),
    )


def _url(use_case: UseCase, range_name: str = "24h") -> str:
    return f"/use-cases/{use_case.pk}/usage/?range={range_name}"


def _csv_url(use_case: UseCase, chart: str, range_name: str = "24h") -> str:
    return f"/use-cases/{use_case.pk}/usage/{chart}.csv?range={range_name}"


def _charts(response) -> dict[str, dict[str, list[int]]]:
    """Each chart's series as the page's context holds them: {chart: {series: values}}."""
    return {
        chart.name: {s.label: s.values for s in chart.series}
        for chart in response.context["charts"]
    }


def _last(values: list[int], n: int) -> list[int]:
    return values[-n:]


def test_the_24_hour_charts_sum_each_hour_of_this_use_case_only(world: World) -> None:
    response = world.alice.get(_url(world.chatbot))

    assert response.status_code == 200
    charts = _charts(response)
    # Hour buckets, oldest first; the last is 14:00 (NOW's hour). 13:00 and 12:00 before it.
    assert len(charts["tokens"]["Prompt tokens"]) == 24
    assert _last(charts["tokens"]["Prompt tokens"], 3) == [7, 0, 150]
    assert _last(charts["tokens"]["Completion tokens"], 3) == [5, 0, 50]
    assert sum(charts["tokens"]["Prompt tokens"]) == 157  # not the 3-day-old row, not globex
    assert charts["refusals"] == {
        "max concurrent requests exceeded": [0] * 21 + [1, 0, 0],
        "queue deadline passed": [0] * 22 + [1, 0],
        "rate limit: use case chatbot tokens per minute": [0] * 23 + [2],
    }
    assert charts["findings"] == {
        "pii (redact)": [0] * 22 + [2, 1],
        "prompt_injection (block)": [0] * 23 + [3],
    }
    # Mean wait: 1,500 ms queued over 10 requests this hour; longest recorded wait 2,400 ms.
    assert _last(charts["waits"]["Mean wait (ms)"], 3) == [0, 0, 150]
    assert _last(charts["waits"]["Longest wait (ms)"], 3) == [0, 0, 2_400]


def test_the_7_day_charts_fold_hours_into_six_hour_buckets(world: World) -> None:
    charts = _charts(world.alice.get(_url(world.chatbot, "7d")))

    prompt = charts["tokens"]["Prompt tokens"]
    assert len(prompt) == 28
    # NOW is 14:25: its bucket is 12:00-18:00, holding 12:59's 7 and this hour's 150.
    assert prompt[-1] == 157
    # Three days ago at 14:25 falls in that day's 12:00 bucket: 12 buckets before the last.
    assert prompt[-13] == 1_000
    assert sum(prompt) == 1_157
    # The findings 25 hours ago (13:00 yesterday) are in yesterday's 12:00 bucket.
    assert charts["findings"]["pii (redact)"][-5] == 50
    assert charts["findings"]["pii (redact)"][-1] == 3


def test_the_page_hands_chart_js_the_same_numbers_and_a_table(world: World) -> None:
    response = world.olivia.get(_url(world.chatbot))
    html = response.content.decode()

    assert 'src="/static/portal/vendor/chart.umd.min.js"' in html
    assert '<script id="chart-tokens-data" type="application/json">' in html
    config = next(c for c in response.context["charts"] if c.name == "tokens").config()
    assert config["datasets"][0]["data"][-3:] == [7, 0, 150]
    assert config["labels"][-1] == "03-10 14:00"
    assert '<canvas data-chart="chart-tokens-data"' in html
    assert '<th scope="row"><time datetime="2026-03-10T14:00:00+00:00">' in html
    assert "(total 212 tokens)" in html


def test_a_range_link_asked_by_htmx_gets_the_charts_alone(world: World) -> None:
    response = world.alice.get(_url(world.chatbot, "30d"), headers={"HX-Request": "true"})

    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<div id="usage-charts">')
    assert "<html" not in html
    assert len(response.context["charts"][0].starts) == 30
    assert 'aria-current="true" class="button primary">30 days</a>' in html


def test_the_csv_is_the_charts_series_exactly(world: World) -> None:
    response = world.audrey.get(_csv_url(world.chatbot, "refusals"))

    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="acme-chatbot-refusals-24h.csv"'
    lines = response.content.decode().splitlines()
    assert lines[0] == (
        "bucket_start_utc,max concurrent requests exceeded,queue deadline passed,"
        "rate limit: use case chatbot tokens per minute"
    )
    assert len(lines) == 25
    assert lines[1] == "2026-03-09T15:00:00Z,0,0,0"
    assert lines[-3:] == [
        "2026-03-10T12:00:00Z,1,0,0",
        "2026-03-10T13:00:00Z,0,1,0",
        "2026-03-10T14:00:00Z,0,0,2",
    ]


def test_the_tokens_csv_over_30_days_has_one_row_a_day(world: World) -> None:
    lines = world.alice.get(_csv_url(world.chatbot, "tokens", "30d")).content.decode().splitlines()

    assert lines[0] == "bucket_start_utc,Prompt tokens,Completion tokens"
    assert lines[-1] == "2026-03-10T00:00:00Z,157,55"
    assert lines[-4] == "2026-03-07T00:00:00Z,1000,1"
    assert len(lines) == 31


def test_an_unknown_chart_or_range_is_refused_or_defaulted(world: World) -> None:
    assert world.alice.get(_csv_url(world.chatbot, "secrets")).status_code == 404
    response = world.alice.get(_url(world.chatbot, "1y"))
    assert response.context["range"].name == "24h"


def test_another_tenants_developer_gets_a_404_for_the_page_and_the_csv(world: World) -> None:
    assert world.bob.get(_url(world.chatbot)).status_code == 404
    assert world.bob.get(_csv_url(world.chatbot, "tokens")).status_code == 404
    assert world.mallory.get(_url(world.chatbot)).status_code == 404
    # bob's own use case is his to read
    assert world.bob.get(_url(world.search)).status_code == 200


def test_signed_out_visitors_are_sent_to_sign_in(world: World) -> None:
    response = Client().get(_csv_url(world.chatbot, "tokens"))
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_the_use_case_page_links_to_its_charts(world: World) -> None:
    html = world.alice.get(f"/use-cases/{world.chatbot.pk}/").content.decode()
    assert f'href="/use-cases/{world.chatbot.pk}/usage/"' in html


def test_a_history_restore_gets_the_whole_page_and_answers_vary_on_htmx(world: World) -> None:
    response = world.alice.get(
        _url(world.chatbot, "7d"),
        headers={"HX-Request": "true", "HX-History-Restore-Request": "true"},
    )

    assert "<html" in response.content.decode()
    assert "HX-Request" in response["Vary"]


def test_a_use_case_with_no_traffic_says_so_under_every_chart(world: World) -> None:
    quiet = make_use_case(world.chatbot.tenant, "quiet")

    response = world.alice.get(_url(quiet))

    assert [c.series for c in response.context["charts"]] == [[], [], [], [], []]
    assert response.content.decode().count("Nothing recorded in this period.") == 5
    assert "<canvas" not in response.content.decode()
