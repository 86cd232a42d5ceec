"""axe-core (installed from npm by ``make assets``) run inside a Playwright page.

The source is evaluated through the DevTools protocol, which the page's Content-Security-Policy
does not govern, so pages are checked under their real headers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.sync_api import Page

AXE = Path(__file__).resolve().parents[1] / "portal" / "static" / "portal" / "vendor" / "axe.min.js"
# WCAG 2.1 A and AA rules; the impacts that fail a test.
TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
FAILING = {"serious", "critical"}


def accessibility_violations(page: Page) -> list[str]:
    """axe's serious and critical WCAG 2.1 AA violations on the page as it is now, one line
    each: rule, impact, the first offending elements."""
    assert AXE.exists(), f"{AXE} is missing: run make assets (make test does)"
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.evaluate(AXE.read_text())
    result: dict[str, Any] = page.evaluate(
        "tags => axe.run(document, {runOnly: {type: 'tag', values: tags}})", TAGS
    )
    lines = []
    for violation in result["violations"]:
        if violation["impact"] in FAILING:
            targets = [" ".join(node["target"]) for node in violation["nodes"][:3]]
            lines.append(
                f"{page.url}: {violation['id']} ({violation['impact']}): "
                f"{violation['help']} — {targets}"
            )
    return lines
