"""The top bar in real Chromium: one row at 1280 px for each role, every link reachable with
the keyboard alone (the "More" menu opened with Enter, closed with Escape), and still usable
at 800 px (nothing off screen, the menu inside the window).

Personas: olivia (officer, staff: the longest bar, Admin included), alice (developer of
acme), audrey (auditor).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from governance.roles import Role
from testkit.axe import accessibility_violations
from testkit.browser import sign_in
from testkit.factories import make_tenant, make_use_case, make_user

PEOPLE = ("olivia", "alice", "audrey")
MAX_TAB_PRESSES = 60


@pytest.fixture
def people(portal_server: str) -> str:
    acme = make_tenant("acme")
    make_use_case(acme, "support-chatbot")
    olivia = make_user("olivia", Role.OFFICER)
    olivia.is_staff = True
    olivia.save(update_fields=["is_staff"])
    make_user("alice", Role.DEVELOPER, tenants=(acme,))
    make_user("audrey", Role.AUDITOR)
    return portal_server


@pytest.fixture
def page_for(browser: Browser, people: str) -> Iterator[Any]:
    contexts = []

    def open_page(username: str, width: int) -> Page:
        context = browser.new_context(base_url=people, viewport={"width": width, "height": 800})
        context.set_default_timeout(10_000)
        contexts.append(context)
        page = context.new_page()
        sign_in(page, username)
        page.goto("/dashboard/")
        return page

    try:
        yield open_page
    finally:
        for context in contexts:
            context.close()


def _boxes(page: Page) -> list[dict[str, Any]]:
    """The bar's visible pieces (brand, each link, "More", the account's parts) as boxes."""
    boxes: list[dict[str, Any]] = page.evaluate(
        """() => Array.from(document.querySelectorAll(
              '.topbar > .brand, .topbar nav > a, .topbar nav > details > summary,'
              + ' .topbar .account > *'))
            .map(el => { const r = el.getBoundingClientRect();
                         return {text: el.textContent.trim(), top: r.top, bottom: r.bottom,
                                 left: r.left, right: r.right, height: r.height}; })"""
    )
    return boxes


@pytest.mark.parametrize("username", PEOPLE)
def test_the_bar_is_one_row_at_1280_px(page_for: Any, username: str) -> None:
    """GIVEN a person of each role WHEN a page opens 1280 px wide THEN the brand, every link
    of the bar, "More" and the account sit on one row, inside the window."""
    page = page_for(username, 1280)
    boxes = _boxes(page)
    assert len(boxes) >= 5, boxes
    tallest = max(box["height"] for box in boxes)
    top, bottom = min(box["top"] for box in boxes), max(box["bottom"] for box in boxes)
    assert bottom - top < tallest * 1.5, f"the bar wraps for {username}: {boxes}"
    middles = {round((box["top"] + box["bottom"]) / 2) for box in boxes}
    assert max(middles) - min(middles) <= 4, boxes
    assert max(box["right"] for box in boxes) <= 1280
    # The pieces do not overlap one another along the row.
    ordered = sorted(boxes, key=lambda box: box["left"])
    for before, after in itertools.pairwise(ordered):
        assert before["right"] <= after["left"] + 0.5, (before, after)


def _keyboard_walk(page: Page) -> tuple[list[str], set[str]]:
    """Tab from the top of the page through the bar, opening "More" with Enter when focus
    reaches it; what got focus (links by href), and every link the nav holds."""
    all_links: set[str] = set(
        page.eval_on_selector_all("nav[aria-label=Main] a", "els => els.map(e => e.href)")
    )
    page.locator("body").focus()
    reached: list[str] = []
    for _ in range(MAX_TAB_PRESSES):
        page.keyboard.press("Tab")
        focused: dict[str, Any] = page.evaluate(
            """() => { const el = document.activeElement;
                       return {tag: el.tagName, href: el.href || '',
                               inNav: !!el.closest('nav[aria-label=Main]'),
                               inBar: !!el.closest('.topbar'),
                               open: !!(el.closest('details') || {}).open}; }"""
        )
        if focused["tag"] == "SUMMARY":
            reached.append("summary")
            if not focused["open"]:
                page.keyboard.press("Enter")
                expect(page.locator("#nav-more")).to_have_attribute("open", "")
        elif focused["inNav"]:
            reached.append(focused["href"])
        elif reached and not focused["inBar"]:
            break  # past the bar, into the page
    return reached, all_links


@pytest.mark.parametrize("username", PEOPLE)
def test_every_link_of_the_bar_is_reached_with_the_keyboard(page_for: Any, username: str) -> None:
    """GIVEN a person of each role at 1280 px WHEN they Tab through the bar (Enter on "More")
    THEN focus reaches every link the nav holds, the menu's included, and the menu closes once
    focus moves past it; Escape closes it and puts focus back on "More"; axe finds nothing
    serious with the menu open."""
    page = page_for(username, 1280)
    reached, all_links = _keyboard_walk(page)
    assert "summary" in reached, f"no More menu for {username}"
    assert {href for href in reached if href != "summary"} == all_links
    assert len(all_links) >= 6

    menu = page.locator("#nav-more")
    # Tabbing on past the menu's last link closed it behind the keyboard.
    expect(menu).not_to_have_attribute("open", "")
    menu.locator("summary").focus()
    page.keyboard.press("Enter")
    first_hidden = menu.locator("li a").first
    expect(first_hidden).to_be_visible()
    assert accessibility_violations(page) == []
    first_hidden.focus()
    page.keyboard.press("Escape")
    expect(menu).not_to_have_attribute("open", "")
    expect(first_hidden).to_be_hidden()
    assert page.evaluate("() => document.activeElement.tagName") == "SUMMARY"


@pytest.mark.parametrize("username", PEOPLE)
def test_the_bar_is_usable_at_800_px(page_for: Any, username: str) -> None:
    """GIVEN a person of each role 800 px wide WHEN the page opens and "More" is clicked
    THEN no link of the bar is off screen, the page does not scroll sideways, and the menu's
    links show inside the window and lead somewhere."""
    page = page_for(username, 800)
    for box in _boxes(page):
        assert box["left"] >= 0, box
        assert box["right"] <= 800, box
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 800
    nav = page.get_by_role("navigation", name="Main")
    nav.locator("summary").click()
    links = nav.locator(".nav-more li a")
    expect(links.first).to_be_visible()
    for index in range(links.count()):
        box = links.nth(index).bounding_box()
        assert box is not None
        assert box["x"] >= 0
        assert box["x"] + box["width"] <= 800
    href = links.first.get_attribute("href")  # Admission decisions, for every role
    links.first.click()
    expect(page.get_by_role("heading", level=1)).to_be_visible()
    # The page reached from the menu is marked current there, and "More" says it holds it.
    expect(nav.locator(f'.nav-more a[href="{href}"]')).to_have_attribute("aria-current", "page")
    expect(nav.locator("summary")).to_have_class("current")
