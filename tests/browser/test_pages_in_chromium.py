"""Every portal page, as the role that uses it, in a real browser under the real headers.

GIVEN acme's chatbot, a key request from alice (developer) and one from olivia (officer),
WHEN each role opens the pages of its job,
THEN each page renders without one Content-Security-Policy violation or console error (a
template scanned for inline scripts says nothing about what the browser refuses), without one
serious or critical WCAG 2.1 AA violation that axe-core finds (contrast, labels, names), with
a visible focus ring on what the keyboard reaches, and the review queue shows olivia no
Approve button on her own request, but one on alice's.

Screenshots of every page land in pytest's temp dir (``--basetemp`` puts them in view).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Browser, ConsoleMessage, Page, expect

from governance.audit import Actor
from governance.models import GuardrailSelection, UseCase
from governance.roles import Role
from governance.services.api_keys import api_key_request
from records.models import GuardrailFinding, GuardrailHour
from testkit.axe import accessibility_violations
from testkit.browser import sign_in
from testkit.factories import PASSWORD, make_model, make_tenant, make_use_case, make_user
from testkit.records import make_record

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def acme_requests() -> dict[str, int]:
    acme = make_tenant("acme")
    chatbot = make_use_case(acme, "chatbot", models=(make_model("llama-sim"),))
    alice = make_user("alice", Role.DEVELOPER, tenants=(acme,))
    olivia = make_user("olivia", Role.OFFICER)
    make_user("avery", Role.AUDITOR)
    keys = {}
    for person, name in ((alice, "alice-ci"), (olivia, "olivia-probe")):
        key = api_key_request(
            actor=Actor.for_user(person), use_case=chatbot, name=name, reason="integration"
        )
        keys[name] = key.pk
    # A guardrail it runs and something it found, so their tables render too.
    GuardrailSelection.objects.create(
        use_case=chatbot, guardrail="pii", side="both", action="redact", config={"entities": []}
    )
    finding = {"use_case_id": chatbot.pk, "tenant_id": acme.pk, "tenant": "acme"}
    GuardrailFinding.objects.create(
        stream_id="1-0",
        request_id="req-1",
        occurred_at=timezone.now(),
        model="llama-sim",
        stage="request",
        guardrail="pii",
        action="redacted",
        entities={"EMAIL_ADDRESS": 1},
        score=0.9,
        **finding,
    )
    GuardrailHour.objects.create(
        guardrail="pii",
        action="redacted",
        hour=timezone.now().replace(minute=0, second=0, microsecond=0),
        findings=1,
        **finding,
    )
    return {"use_case": chatbot.pk, **keys}


def _open_as(browser: Browser, base_url: str, username: str) -> tuple[Page, list[str]]:
    """A signed-in page, and the list its console errors and CSP violations go to."""
    page = browser.new_context(base_url=base_url).new_page()
    page.set_default_timeout(10_000)
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(f"{page.url}: {message.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(f"{page.url}: {error}"))
    sign_in(page, username)
    return page, problems


# Swagger UI's own markup (drf-spectacular serves it as is: no lang, nested controls, its
# contrast) is not the portal's to fix; the portal's templates get no such pass.
THIRD_PARTY_PAGES = {"/api/docs/"}


def _visit(page: Page, path: str, shots: Path, name: str) -> list[str]:
    """Open the page; what axe-core finds wrong with it."""
    response = page.goto(path)
    assert response is not None
    assert response.status == 200, f"{path}: {response.status}"
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
    return [] if path in THIRD_PARTY_PAGES else accessibility_violations(page)


def _focus_ring(page: Page) -> float:
    """The width in pixels of the solid outline around what the keyboard has reached (0 when
    there is none, or only the browser's own 1px ring, which vanishes on the dark top bar)."""
    width: float = page.evaluate(
        "() => { const s = getComputedStyle(document.activeElement);"
        " return s.outlineStyle === 'solid' ? parseFloat(s.outlineWidth) : 0; }"
    )
    return width


def test_every_page_renders_under_the_content_security_policy(
    browser: Browser,
    portal_server: str,
    acme_requests: dict[str, int],
    screenshot_dir: Path,
    settings: Any,
    valkey_url: str,
) -> None:
    settings.VALKEY_URL = valkey_url  # the dead-letter page reads its stream
    use_case, alice_key = acme_requests["use_case"], acme_requests["alice-ci"]
    record = make_record(UseCase.objects.get(pk=use_case)).record_id
    journeys = {
        "olivia": [
            "/",
            "/dashboard/",
            "/review/",
            "/admission-decisions/",
            "/guardrail-findings/",
            f"/use-cases/{use_case}/",
            "/records/",
            "/audit/",
            "/files/",
            "/async/dead-letters/",
            "/govern/",
            "/govern/tenants/new/",
            "/govern/use-cases/new/",
            "/govern/priority-matrix/",
            f"/use-cases/{use_case}/usage/",
            "/api/docs/",
        ],
        "alice": [
            "/dashboard/",
            f"/use-cases/{use_case}/",
            f"/use-cases/{use_case}/keys/new/",
            f"/keys/{alice_key}/",
            "/records/",
            "/files/",
            "/my-usage/",
            "/use-cases/new/",
            f"/use-cases/{use_case}/usage/",
        ],
        "avery": [
            "/dashboard/",
            "/admission-decisions/",
            "/guardrail-findings/",
            "/records/",
            f"/records/{record}/",
            "/audit/",
            f"/use-cases/{use_case}/usage/",
        ],
    }
    problems: list[str] = []
    inaccessible: list[str] = []
    for username, paths in journeys.items():
        page, seen = _open_as(browser, portal_server, username)
        for path in paths:
            inaccessible += _visit(
                page, path, screenshot_dir, f"{username}{path.replace('/', '_')}"
            )
        if username == "olivia":
            page.goto("/review/")
            own = page.get_by_role("row").filter(has_text="olivia-probe")
            theirs = page.get_by_role("row").filter(has_text="alice-ci")
            expect(own).to_contain_text("another officer decides it")
            expect(own.get_by_role("button", name="Approve")).to_have_count(0)
            expect(theirs.get_by_role("button", name="Approve")).to_be_visible()
        problems += seen
        page.context.close()

    assert problems == [], "\n".join(problems)
    assert inaccessible == [], "\n".join(inaccessible)


def test_the_sign_in_page_is_accessible_and_the_keyboard_focus_shows(
    browser: Browser, portal_server: str, acme_requests: dict[str, int]
) -> None:
    """GIVEN the sign-in page and then the dashboard, WHEN a person tabs through them, THEN
    the skip link comes first and every element the keyboard reaches draws a focus outline."""
    page = browser.new_context(base_url=portal_server).new_page()
    try:
        page.goto("/accounts/login/")
        assert accessibility_violations(page) == []
        page.get_by_label("Username").fill("avery")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in", exact=True).click()
        expect(page.locator(".who")).to_contain_text("avery")
        page.goto("/dashboard/")
        page.keyboard.press("Tab")
        expect(page.locator(":focus")).to_have_text("Skip to content")
        expect(page.locator(":focus")).to_be_visible()
        unringed = []
        for _ in range(12):
            if _focus_ring(page) < 2:
                unringed.append(page.evaluate("() => document.activeElement.outerHTML"))
            page.keyboard.press("Tab")
        assert unringed == [], unringed
    finally:
        page.context.close()
