"""The live fleet page in Chromium through a Valkey outage: the web process and the fleet
publisher on a Valkey of the test's own, stopped and started again on the same port.

GIVEN olivia (officer) on the live fleet page, live
WHEN Valkey stops
THEN the page says the data is unavailable, since when, and marks the figures as not live
(not frozen numbers under a "live" badge); WHEN Valkey is back THEN the page is live again
with the new figures, without a reload.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from governance.roles import Role
from testkit.axe import accessibility_violations
from testkit.browser import sign_in
from testkit.factories import make_user
from testkit.fleet import FleetWeb, fleet_web, web_password
from testkit.valkey_outage import MODEL, R1, Outage

pytestmark = pytest.mark.django_db(transaction=True)

OUTAGE_MS = 30_000  # generous: the consumer's rejoin backoff tops out at 5 s, CPUs are shared


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Outage, FleetWeb]]:
    web_password(make_user("olivia", Role.OFFICER))
    store = Outage()
    store.start(running=3)
    try:
        with fleet_web(store.url, tmp_path, interval_s=0.5) as web:
            yield store, web
    finally:
        if store.server.is_running():
            store.stop()


@pytest.fixture
def page(browser: Browser, stack: tuple[Outage, FleetWeb]) -> Iterator[Page]:
    context = browser.new_context(base_url=stack[1].url)
    context.set_default_timeout(10_000)
    try:
        opened = context.new_page()
        sign_in(opened, "olivia")
        yield opened
    finally:
        context.close()  # a live page left open keeps reconnecting


RUNNING_CELL = (
    f'section.fleet-model[data-model="{MODEL}"] tr[data-replica="{R1}"] td[data-field="running"]'
)


def test_the_page_says_unavailable_during_the_outage_and_goes_live_again_by_itself(
    stack: tuple[Outage, FleetWeb], page: Page
) -> None:
    store, _ = stack
    page.goto("/fleet/")
    status, notice, data = (
        page.locator("#fleet-status"),
        page.locator("#fleet-notice"),
        page.locator("#fleet-data"),
    )
    expect(status).to_have_attribute("data-state", "live")
    expect(page.locator(RUNNING_CELL)).to_have_text("3")
    expect(notice).to_be_hidden()
    expect(data).to_have_attribute("data-stale", "false")
    page.evaluate("() => { window.sameDocument = true; }")  # gone if the page reloads

    store.stop()
    expect(status).to_have_attribute("data-state", "unavailable", timeout=OUTAGE_MS)
    expect(status).to_have_text("unavailable")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text("Live data is unavailable")
    expect(notice).to_contain_text("cannot reach Valkey")
    expect(notice).to_contain_text("are not live")
    expect(data).to_have_attribute("data-stale", "true")
    # The last figures stay for reference, marked, and no longer change.
    expect(page.locator(RUNNING_CELL)).to_have_text("3")
    assert accessibility_violations(page) == []

    store.start(running=9)
    expect(status).to_have_attribute("data-state", "live", timeout=OUTAGE_MS)
    expect(page.locator(RUNNING_CELL)).to_have_text("9")
    expect(notice).to_be_hidden()
    expect(data).to_have_attribute("data-stale", "false")
    assert page.evaluate("() => window.sameDocument === true")
