"""An officer hovers the spend chart in Chromium: it draws under the real CSP from exact
decimal strings, the tooltip quotes the amount with the currency as the table writes it, the
"no price" notice is read by axe like the rest of the page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Browser, ConsoleMessage, expect

from governance.audit import Actor
from governance.prices import model_price_add
from governance.roles import Role
from records.models import UsageMinute
from testkit.axe import accessibility_violations
from testkit.browser import sign_in
from testkit.factories import make_model, make_tenant, make_use_case, make_user
from tests.browser.test_usage_charts import _hover_last_bar

pytestmark = pytest.mark.django_db(transaction=True)


def _minute(use_case_id: int, model: str, prompt: int, completion: int) -> None:
    UsageMinute.objects.create(
        use_case_id=use_case_id,
        tenant="acme",
        model=model,
        minute=timezone.now().replace(minute=0, second=0, microsecond=0),
        requests=1,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


def test_an_officer_hovers_the_spend_and_reads_it_in_the_currency(
    browser: Browser, portal_server: str, settings: Any, screenshot_dir: Path
) -> None:
    settings.CURRENCY = "CHF"
    acme = make_tenant("acme")
    llama, mistral = make_model("llama"), make_model("mistral")
    chatbot = make_use_case(acme, "chatbot", models=(llama, mistral))
    make_user("olivia", Role.OFFICER)
    model_price_add(
        actor=Actor.system("test"),
        model=llama,
        effective_from="2025-01-01T00:00:00Z",
        input_per_mtok="2.00",
        output_per_mtok="6.00",
    )
    _minute(chatbot.pk, "llama", 1_234_000, 56_000)  # 2.468 + 0.336 = 2.804
    _minute(chatbot.pk, "mistral", 500, 0)  # no price
    page = browser.new_context(
        base_url=portal_server, viewport={"width": 1280, "height": 1000}
    ).new_page()
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            problems.append(message.text)

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(str(error)))
    sign_in(page, "olivia")

    page.goto(f"/use-cases/{chatbot.pk}/usage/")

    spend = page.locator("#chart-spend")
    expect(spend.locator("[data-total]")).to_have_text(
        "Total for the last 24 hours: 2.80 CHF (usage with a price only)"
    )
    expect(spend.locator("[data-notice]")).to_contain_text("mistral (500 tokens)")
    tooltip = _hover_last_bar(page, "spend")
    assert tooltip["lines"] == ["llama: 2.80 CHF"]
    assert tooltip["values"] == [2.804]  # drawn at its height; the text is the exact amount's
    spend.screenshot(path=str(screenshot_dir / "spend-chart.png"))
    spend.get_by_text("Numbers").click()
    expect(spend.locator("tbody tr").last.locator("td")).to_have_text(["2.80"])
    assert accessibility_violations(page) == []
    assert problems == []
    page.context.close()
