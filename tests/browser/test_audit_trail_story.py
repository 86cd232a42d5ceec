"""An auditor's journey on the audit trail, in Chromium under the real headers.

GIVEN a trail with an officer's and a developer's events,
WHEN avery (auditor) opens the audit trail, verifies the chain with the button, filters the
events to one actor, and downloads the signed export,
THEN the verification appears in place (htmx: no reload, no second page view) with the
keyboard focus kept on the button, the filter shows exactly that actor's events, the download
verifies offline with the deployment's public key, and each step is in the trail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from governance.audit import Actor
from governance.audit_export import export_verify, signing_public_key
from governance.models import AuditEvent
from governance.roles import Role
from governance.services.api_keys import api_key_request
from testkit.axe import accessibility_violations
from testkit.browser import sign_in
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def _count(action: str) -> int:
    return AuditEvent.objects.filter(action=action, actor="avery").count()


def test_an_auditor_verifies_filters_and_downloads_the_trail(
    browser: Browser, portal_server: str, tmp_path: Path
) -> None:
    acme = make_tenant("acme")
    chatbot = make_use_case(acme, "chatbot", models=(make_model("llama-sim"),))
    alice = make_user("alice", Role.DEVELOPER, tenants=(acme,))
    make_user("avery", Role.AUDITOR)
    api_key_request(actor=Actor.for_user(alice), use_case=chatbot, name="alice-ci", reason="CI")

    context = browser.new_context(base_url=portal_server, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        sign_in(page, "avery")

        page.goto("/audit/")
        expect(page.locator("#view-audited")).to_contain_text("audit.viewed")
        expect(page.locator("#chain-status")).to_have_text(
            "The chain has not been verified from the portal yet."
        )
        assert _count("audit.viewed") == 1

        page.get_by_role("button", name="Verify chain").focus()
        page.keyboard.press("Enter")
        expect(page.locator("#chain-status")).to_contain_text("Verified up to event #")
        expect(page.locator("#chain-checked")).to_contain_text("Checked by avery")
        expect(page.locator("#verify-chain")).to_be_focused()
        assert _count("audit.verified") == 1
        assert _count("audit.viewed") == 1  # swapped in place: the page was not reloaded
        assert accessibility_violations(page) == []

        page.get_by_label("Actor").fill("alice")
        page.get_by_role("button", name="Filter").click()
        rows = page.locator("#audit-events tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("apikey.request")
        expect(page.get_by_role("heading", name="Events (1)")).to_be_visible()

        with page.expect_download() as download_info:
            page.get_by_role("button", name="Download signed export").click()
        saved = tmp_path / download_info.value.suggested_filename
        download_info.value.save_as(saved)
    finally:
        context.close()

    assert saved.name.startswith("switchyard-audit-")
    check = export_verify(saved.read_bytes(), public_key=signing_public_key())
    assert check.ok, check.problem
    assert check.chain_ok
    assert b'"action":"audit.verified"' in saved.read_bytes()
    assert _count("audit.exported") == 1
    assert _count("audit.viewed") == 2  # the first view and the filtered one
