"""An auditor's records story in a real browser, with content in real object storage.

GIVEN acme's chatbot, whose record policy is full, with a plain and a streamed chat stored
(sealed, in a SeaweedFS bucket) and a refused request kept as metadata,
WHEN audrey the auditor signs in, searches the records, opens a transcript, downloads the
search as JSON Lines and then the signed audit trail,
THEN she reads the request and the answer, the download holds exactly those records, and
both the transcript she read and the downloads she made are in the audit trail.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from governance.audit_export import export_verify, signing_public_key
from governance.models import AuditEvent
from governance.roles import Role
from testkit.browser import sign_in
from testkit.factories import make_key, make_tenant, make_use_case, make_user
from testkit.records import (
    chat_request,
    chat_response,
    make_record,
    sse_response,
    store_content,
)
from testkit.records_store import RecordsStore

pytestmark = pytest.mark.django_db(transaction=True)


def _signed_in(browser: Browser, base_url: str, username: str) -> tuple[BrowserContext, Page]:
    context = browser.new_context(base_url=base_url, accept_downloads=True)
    context.set_default_timeout(10_000)
    page = context.new_page()
    sign_in(page, username)
    return context, page


def _nav(page: Page, link: str) -> None:
    page.get_by_role("navigation", name="Main").get_by_role("link", name=link).click()


def test_an_auditor_searches_reads_a_transcript_downloads_and_sees_it_audited(
    browser: Browser, portal_server: str, records_store: RecordsStore, screenshot_dir: Path
) -> None:
    acme = make_tenant("acme")
    chatbot = make_use_case(acme, "chatbot", record_policy="full")
    key, _ = make_key(chatbot, name="checkout-service")
    plain = make_record(chatbot, minutes=1, key_id=key.pk, request_id="req-refund")
    streamed = make_record(chatbot, minutes=2, key_id=key.pk, streamed=True)
    refused = make_record(chatbot, minutes=3, status=429, request_id="req-refused")
    store_content(
        [
            (plain, chat_request("What is the refund policy?"), chat_response("Thirty days.")),
            (streamed, chat_request("Count", stream=True), sse_response("One, ", "two.")),
        ]
    )
    make_user("audrey", Role.AUDITOR)

    context, page = _signed_in(browser, portal_server, "audrey")
    try:
        # Search: the successful requests of acme's chatbot.
        _nav(page, "Records")
        expect(page.get_by_role("heading", name="Interaction records")).to_be_visible()
        page.get_by_label("Use case").select_option(label="acme/chatbot")
        page.get_by_label("Status").fill("2xx")
        page.get_by_role("button", name="Search").click()
        expect(page.locator("#record-count")).to_have_text("2")
        rows = page.locator("#records tbody tr")
        expect(rows).to_have_count(2)
        expect(rows.nth(0)).to_contain_text(streamed.request_id)
        expect(rows.nth(1)).to_contain_text("req-refund")
        expect(page.locator("#records")).not_to_contain_text(refused.request_id)
        page.screenshot(path=str(screenshot_dir / "records-search.png"), full_page=True)

        # Open the plain chat's transcript.
        rows.nth(1).get_by_role("link").first.click()
        expect(page.get_by_role("heading", name=f"Record {plain.record_id}")).to_be_visible()
        expect(page.locator("#record-facts")).to_contain_text("checkout-service")
        expect(page.locator("#transcript-request")).to_contain_text("What is the refund policy?")
        expect(page.locator("#transcript-response")).to_contain_text("Thirty days.")
        page.screenshot(path=str(screenshot_dir / "record-transcript.png"), full_page=True)

        # Back to the search, and download it as JSON Lines.
        page.go_back()
        expect(page.locator("#record-count")).to_have_text("2")
        with page.expect_download() as download_info:
            page.get_by_role("link", name="Export JSON Lines").click()
        download = download_info.value
        assert download.suggested_filename.startswith("switchyard-records-")
        assert download.suggested_filename.endswith(".jsonl")
        saved = screenshot_dir / download.suggested_filename
        download.save_as(saved)
        exported = saved.read_bytes()
        lines = [orjson.loads(line) for line in exported.splitlines()]
        assert [line["record_id"] for line in lines] == [streamed.record_id, plain.record_id]
        assert lines[1]["response"] == chat_response("Thirty days.").decode()
        assert lines[0]["response"] == sse_response("One, ", "two.").decode()

        # The audit trail shows what she read and what she downloaded.
        _nav(page, "Audit trail")
        page.get_by_role("button", name="Verify chain").click()
        expect(page.locator("#chain-status")).to_contain_text("Verified up to event #")
        events = page.locator("#audit-events tbody tr")
        expect(events.filter(has_text="records.exported").first).to_contain_text(
            "2 records as jsonl"
        )
        expect(events.filter(has_text="records.viewed").first).to_contain_text(plain.record_id)
        page.screenshot(path=str(screenshot_dir / "audit-trail.png"), full_page=True)
        with page.expect_download() as signed_info:
            page.get_by_role("button", name="Download signed export").click()
        signed = screenshot_dir / "audit.jsonl"
        signed_info.value.save_as(signed)
    finally:
        context.close()

    recorded = AuditEvent.objects.get(action="records.exported")
    assert recorded.actor == "audrey"
    assert recorded.after is not None
    assert recorded.after["sha256"] == hashlib.sha256(exported).hexdigest()
    assert recorded.after["records"] == 2
    assert recorded.after["filter"] == {"use_case": chatbot.pk, "status": "2xx"}
    check = export_verify(signed.read_bytes(), public_key=signing_public_key())
    assert check.ok, check.problem
    assert check.chain_ok
    assert b'"action":"records.exported"' in signed.read_bytes()
    assert AuditEvent.objects.filter(action="audit.exported", actor="audrey").count() == 1
