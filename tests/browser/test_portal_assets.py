"""The portal's front-end libraries (make assets: htmx, Chart.js, axe-core from npm) load under
the real Content-Security-Policy, and the axe check the browser tests use finds what it should.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, ConsoleMessage

from testkit.axe import accessibility_violations

pytestmark = pytest.mark.django_db(transaction=True)


def test_htmx_loads_under_the_csp_and_the_sign_in_page_passes_axe(
    browser: Browser, portal_server: str
) -> None:
    page = browser.new_context(base_url=portal_server).new_page()
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(message.text)

    page.on("console", on_console)
    page.goto("/accounts/login/")
    page.wait_for_load_state("networkidle")

    assert page.evaluate("() => typeof window.htmx") == "object"
    assert page.evaluate("() => htmx.config.includeIndicatorStyles") is False
    assert accessibility_violations(page) == []
    assert problems == []
    page.context.close()


def test_axe_reports_an_unlabelled_field_and_low_contrast(
    browser: Browser, portal_server: str
) -> None:
    """The check can fail: a page given an input without a label and grey-on-grey text."""
    page = browser.new_context(base_url=portal_server).new_page()
    page.goto("/accounts/login/")
    page.evaluate(
        """() => {
            const field = document.createElement('input');
            field.type = 'text';
            document.querySelector('main').appendChild(field);
            const faint = document.createElement('p');
            faint.textContent = 'hard to read';
            faint.style.color = '#bbbbbb';
            faint.style.background = '#ffffff';
            document.querySelector('main').appendChild(faint);
        }"""
    )

    found = "\n".join(accessibility_violations(page))

    assert "label" in found
    assert "color-contrast" in found
    page.context.close()
