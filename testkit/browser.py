"""What every browser test does first: sign in through the portal's own login form."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from testkit.factories import PASSWORD


def sign_in(page: Page, username: str) -> None:
    """Sign ``username`` in (a local account made by testkit.factories.make_user) and wait for
    the top bar to name them."""
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in", exact=True).click()
    expect(page.locator(".who")).to_contain_text(username)
