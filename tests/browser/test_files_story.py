"""An auditor follows a file's job live and listens to and downloads it, in a real browser.

GIVEN acme's call recording (a real WAV in a SeaweedFS bucket) being transcribed in four
parts, two of them done,
WHEN audrey the auditor opens it from the Files page, and the job runner finishes the other
parts and stores the transcript while she watches,
THEN the progress bar moves on its own (no reload), polling stops when the file is done, the
audio element loads and plays the original (seeking by Range), the transcript downloads, and
every listen and download is in the audit trail with her name and the object.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from governance.models import AuditEvent
from governance.roles import Role
from testkit.browser import sign_in
from testkit.factories import make_model, make_tenant, make_use_case, make_user
from testkit.files import files_bucket, finish, make_file, part_done, start, upload, wav_bytes
from testkit.records_store import RecordsStore

pytestmark = pytest.mark.django_db(transaction=True)

AUDIO = wav_bytes(2.0)
TRANSCRIPT = b"Hello, this is acme's support line. How can I help?\n"


@pytest.fixture
def files_store(records_store: RecordsStore) -> Iterator[str]:
    with files_bucket(records_store) as bucket:
        yield bucket


def _sign_in(page: Page, username: str) -> None:
    sign_in(page, username)


def test_an_auditor_watches_a_file_progress_listens_and_downloads_the_transcript(
    browser: Browser, portal_server: str, files_store: str, screenshot_dir: Path
) -> None:
    acme = make_tenant("acme")
    whisper = make_model("whisper", capabilities=["transcription"])
    transcribe = make_use_case(acme, "transcribe", models=(whisper,))
    call = start(upload(make_file(transcribe, whisper, "call-0001.wav"), AUDIO), parts=4)
    part_done(call, 0)
    call = part_done(call, 1)
    make_user("audrey", Role.AUDITOR)

    context = browser.new_context(base_url=portal_server, accept_downloads=True)
    context.set_default_timeout(10_000)
    page = context.new_page()
    try:
        _sign_in(page, "audrey")
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Files").click()
        expect(page.get_by_role("heading", name="Files", exact=True)).to_be_visible()
        row = page.locator("#files tbody tr").filter(has_text="call-0001.wav")
        expect(row.get_by_role("progressbar")).to_have_attribute("value", "50")
        page.screenshot(path=str(screenshot_dir / "files-list.png"), full_page=True)

        row.get_by_role("link", name="call-0001.wav").click()
        expect(page.get_by_role("heading", name="call-0001.wav")).to_be_visible()
        expect(page.locator("#download-notice")).to_contain_text("recorded in the audit trail")
        bar = page.get_by_role("progressbar", name="Processing progress")
        expect(bar).to_have_attribute("value", "50")
        expect(page.locator("#file-parts-summary")).to_have_text("2 of 4 parts done")
        page.screenshot(path=str(screenshot_dir / "file-running.png"), full_page=True)

        # The job runner finishes a part: the bar follows without a reload.
        call = part_done(call, 2)
        expect(bar).to_have_attribute("value", "75")
        expect(page.locator("#file-parts-summary")).to_have_text("3 of 4 parts done")

        # The last part and the transcript: done, the outputs appear, the polling stops.
        call = part_done(call, 3)
        finish(call, {"transcript": ("transcript.txt", TRANSCRIPT)})
        expect(page.locator("#file-progress")).to_have_attribute("data-final", "true")
        expect(bar).to_have_attribute("value", "100")
        expect(page.locator("#file-progress-announce")).to_have_text("State: Done.")
        expect(page.locator("#file-history tbody tr").last).to_contain_text("fileregistration.done")
        assert page.locator("#file-live").get_attribute("data-poll") is None

        # The original plays in the page (muted: headless Chromium's autoplay rule), and seeks.
        audio = page.locator("#file-audio")
        expect(audio).to_be_visible()
        page.wait_for_function("() => document.getElementById('file-audio').readyState >= 1")
        duration = audio.evaluate("a => a.duration")
        assert abs(duration - 2.0) < 0.05, duration
        audio.evaluate("a => { a.muted = true; return a.play(); }")
        page.wait_for_function("() => document.getElementById('file-audio').currentTime > 0")
        audio.evaluate("a => { a.currentTime = 1.5; }")
        page.wait_for_function(
            "() => { const a = document.getElementById('file-audio');"
            " return a.currentTime >= 1.5 || a.ended; }"
        )
        page.screenshot(path=str(screenshot_dir / "file-done.png"), full_page=True)

        # By keyboard alone: Tab reaches the transcript's link, Enter downloads it.
        page.locator("h1").click()
        for _ in range(40):
            page.keyboard.press("Tab")
            if page.evaluate("() => document.activeElement.textContent") == "Download transcript":
                break
        else:
            pytest.fail("Tab never reached the transcript's download link")
        with page.expect_download() as download_info:
            page.keyboard.press("Enter")
        download = download_info.value
        assert download.suggested_filename == "call-0001-transcript.txt"
        saved = screenshot_dir / download.suggested_filename
        download.save_as(saved)
        assert saved.read_bytes() == TRANSCRIPT
    finally:
        context.close()

    call.refresh_from_db()
    events = list(AuditEvent.objects.filter(action="file.download").order_by("sequence"))
    assert {event.actor for event in events} == {"audrey"}
    objects = [(event.after or {}).get("object") for event in events]
    assert call.outputs["transcript"] in objects
    listens = [event for event in events if (event.after or {}).get("which") == "original"]
    assert listens, "the audio element's requests were not audited"
    assert all((event.after or {}).get("object") == call.source_object for event in listens)


def test_a_developer_sees_a_file_cancelled_elsewhere_and_the_cancel_form_goes(
    browser: Browser, portal_server: str, files_store: str
) -> None:
    from governance.audit import Actor
    from scheduler.files.states import file_cancelled

    acme = make_tenant("acme")
    whisper = make_model("whisper", capabilities=["transcription"])
    transcribe = make_use_case(acme, "transcribe", models=(whisper,))
    queued = upload(make_file(transcribe, whisper, "queued.wav"), AUDIO)
    make_user("alice", Role.DEVELOPER, tenants=(acme,))

    context = browser.new_context(base_url=portal_server)
    context.set_default_timeout(10_000)
    page = context.new_page()
    try:
        _sign_in(page, "alice")
        page.goto(f"/files/{queued.pk}/")
        form = page.locator("#file-cancel-form")
        expect(form).to_be_visible()
        expect(form.get_by_label("Reason (kept in the audit trail)")).to_be_editable()
        file_cancelled(actor=Actor.system("tests"), registration=queued, reason="duplicate")
        expect(page.locator("#file-progress")).to_have_attribute("data-final", "true")
        expect(page.locator("#file-state")).to_have_text("Cancelled")
        expect(form).to_be_hidden()
        expect(page.locator("#file-history tbody tr").last).to_contain_text("duplicate")
    finally:
        context.close()
