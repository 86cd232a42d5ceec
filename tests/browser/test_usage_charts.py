"""An officer reads a use case's usage charts in Chromium: the charts draw under the real CSP,
hovering a bar shows its numbers, the time range switches over htmx, and axe finds nothing."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Browser, ConsoleMessage, Page, expect

from governance.roles import Role
from governance.snapshot import snapshot_publish
from records.models import AdmissionDecision, UsageMinute
from testkit.axe import accessibility_violations
from testkit.browser import sign_in
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def _sign_in(page: Page, username: str) -> None:
    sign_in(page, username)


def _hover_last_bar(page: Page, chart: str) -> dict[str, Any]:
    """Move the real mouse over the chart's last bar; return what Chart.js's tooltip shows."""
    canvas = page.locator(f'canvas[data-chart="chart-{chart}-data"]')
    # Chart.js loads deferred: wait until it has drawn this canvas.
    page.wait_for_function(
        "c => typeof Chart !== 'undefined' && Chart.getChart(c) !== undefined",
        arg=canvas.element_handle(),
    )
    box = canvas.bounding_box()
    assert box is not None
    point = page.evaluate(
        """canvas => {
            const chart = Chart.getChart(canvas);
            const bars = chart.getDatasetMeta(0).data;
            const bar = bars[bars.length - 1];
            return {x: bar.x, y: (bar.y + bar.base) / 2};
        }""",
        canvas.element_handle(),
    )
    page.mouse.move(box["x"] + point["x"], box["y"] + point["y"])
    page.wait_for_function(
        "canvas => Chart.getChart(canvas).tooltip.opacity > 0", arg=canvas.element_handle()
    )
    tooltip: dict[str, Any] = page.evaluate(
        """canvas => {
            const tip = Chart.getChart(canvas).tooltip;
            return {
                title: tip.title,
                lines: tip.body.flatMap(part => part.lines),
                values: tip.dataPoints.map(p => p.raw),
            };
        }""",
        canvas.element_handle(),
    )
    return tooltip


def test_an_officer_hovers_the_charts_and_switches_the_range(
    browser: Browser, portal_server: str, screenshot_dir: Path
) -> None:
    acme = make_tenant("acme")
    chatbot = make_use_case(acme, "chatbot", models=(make_model("llama"),))
    make_user("olivia", Role.OFFICER)
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    UsageMinute.objects.create(
        use_case_id=chatbot.pk,
        tenant="acme",
        model="llama",
        minute=hour,
        requests=3,
        prompt_tokens=1_234,
        completion_tokens=56,
    )
    UsageMinute.objects.create(
        use_case_id=chatbot.pk,
        tenant="acme",
        model="llama",
        minute=hour - timedelta(days=2),
        requests=1,
        prompt_tokens=5,
        completion_tokens=5,
    )
    AdmissionDecision.objects.create(
        stream_id="1-0",
        request_id="r1",
        occurred_at=hour,
        decision="rejected",
        reason="queue_full",
        tenant="acme",
        tenant_id=acme.pk,
        use_case_id=chatbot.pk,
        model="llama",
    )
    page = browser.new_context(
        base_url=portal_server, viewport={"width": 1280, "height": 1000}
    ).new_page()
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            problems.append(message.text)

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(str(error)))
    _sign_in(page, "olivia")

    page.goto(f"/use-cases/{chatbot.pk}/")
    page.get_by_role(
        "link", name="Charts: tokens, spend, refusals, guardrail findings, queue waits"
    ).click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Usage of Chatbot")
    expect(page.locator("canvas[data-chart]")).to_have_count(
        3
    )  # tokens, refusals, waits; no findings
    # Every canvas drawn (Chart.js loads deferred: on a loaded machine it may still be on
    # its way when the heading is there); a chart never drawn fails here, by timeout.
    page.wait_for_function(
        "() => typeof Chart !== 'undefined' && [...document.querySelectorAll('canvas[data-chart]')]"
        ".every(c => Chart.getChart(c) !== undefined && c.width > 0)"
    )

    tooltip = _hover_last_bar(page, "tokens")
    assert tooltip["values"] == [1_234, 56]
    assert tooltip["lines"] == ["Prompt tokens: 1,234 tokens", "Completion tokens: 56 tokens"]
    page.screenshot(path=str(screenshot_dir / "usage-charts.png"), full_page=True)

    refusals = page.locator("#chart-refusals")
    refusals.get_by_text("Numbers").click()
    expect(refusals.locator("tbody tr").last.locator("td")).to_have_text(["1"])
    assert accessibility_violations(page) == []

    page.get_by_role("link", name="7 days").click()
    expect(page.get_by_role("link", name="7 days")).to_have_attribute("aria-current", "true")
    expect(page).to_have_url(f"{portal_server}/use-cases/{chatbot.pk}/usage/?range=7d")
    page.wait_for_function(
        "() => Chart.getChart(document.querySelector('canvas[data-chart=\"chart-tokens-data\"]'))"
        "?.data.labels.length === 28"
    )
    assert _hover_last_bar(page, "tokens")["values"] == [1_234, 56]
    assert accessibility_violations(page) == []
    assert problems == []
    page.context.close()


def test_a_developer_reads_her_remaining_budget_on_my_usage(
    browser: Browser,
    portal_server: str,
    screenshot_dir: Path,
    settings: Any,
    valkey_url: str,
    valkey_client: Any,
) -> None:
    settings.VALKEY_URL = valkey_url
    acme = make_tenant("acme")
    chatbot = make_use_case(
        acme, "chatbot", models=(make_model("llama"),), requests_per_minute=60, tokens_per_day=9_000
    )
    make_user("alice", Role.DEVELOPER, tenants=(acme,))
    snapshot_publish(client=valkey_client)
    # Nothing counted yet: the whole budget is left.
    page = browser.new_context(base_url=portal_server).new_page()
    _sign_in(page, "alice")

    page.get_by_role("link", name="My usage").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("My usage")
    rows = page.locator("table.budget tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first.locator("td")).to_have_text(
        [
            "use case chatbot requests per minute",
            "every allowed model",
            "60 requests/minute",
            "0",
            "60",
            "100%",
        ]
    )
    expect(page.get_by_role("link", name="Charts of its usage")).to_have_attribute(
        "href", f"/use-cases/{chatbot.pk}/usage/"
    )
    page.screenshot(path=str(screenshot_dir / "my-usage.png"), full_page=True)
    assert accessibility_violations(page) == []
    page.context.close()
