"""The whole key story in a real browser, ending at a real gateway.

GIVEN acme's approved chatbot use case, a simulator replica and a gateway process,
WHEN alice requests a key, olivia approves it and alice reveals and copies it,
THEN the gateway serves that key; and once olivia suspends the use case, it refuses it (401)
within seconds.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from governance.roles import Role
from governance.snapshot import snapshot_publish
from ops.processes import wait_until
from testkit.browser import sign_in
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "llama-sim"
# Seconds the gateway may take to honour a governance change (it polls the snapshot's version).
GATEWAY_CATCH_UP_S = 5.0


@pytest.fixture
def gateway_url(settings, valkey_url, valkey_client, start_simulator, start_gateway) -> str:
    """A simulator replica and a gateway, reading the policy Django publishes to test Valkey."""
    settings.VALKEY_URL = valkey_url
    replica = start_simulator(MODEL, "--time-scale", "0")
    acme = make_tenant("acme")
    make_use_case(acme, "chatbot", models=(make_model(MODEL, replicas=[replica.base_url]),))
    make_user("alice", Role.DEVELOPER, tenants=(acme,))
    make_user("olivia", Role.OFFICER)
    snapshot_publish()  # the gateway reports ready only once it has a snapshot
    return str(start_gateway().base_url)


def _signed_in(browser: Browser, base_url: str, username: str) -> tuple[BrowserContext, Page]:
    context = browser.new_context(
        base_url=base_url, permissions=["clipboard-read", "clipboard-write"]
    )
    context.set_default_timeout(10_000)
    page = context.new_page()
    sign_in(page, username)
    return context, page


def _nav(page: Page, link: str) -> None:
    page.get_by_role("navigation", name="Main").get_by_role("link", name=link).click()


def _flash(page: Page, text: str) -> None:
    expect(page.locator(".messages").get_by_text(text)).to_be_visible()


def test_a_key_requested_approved_and_revealed_in_the_browser_works_until_suspended(
    browser: Browser, portal_server: str, gateway_url: str, screenshot_dir: Path
) -> None:
    secret = ""

    def chat() -> int:
        return httpx.post(
            f"{gateway_url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers={"Authorization": f"Bearer {secret}"},
            timeout=5,
        ).status_code

    alice_context, alice = _signed_in(browser, portal_server, "alice")
    olivia_context, olivia = _signed_in(browser, portal_server, "olivia")
    try:
        # alice asks for a key for her approved use case, and sees it pending.
        _nav(alice, "My use cases & keys")
        alice.get_by_role("link", name="Chatbot").click()
        alice.get_by_role("link", name="Request an API key").click()
        alice.get_by_label("Name", exact=True).fill("checkout-service")
        alice.get_by_label("Reason").fill("The checkout service answers order questions.")
        alice.get_by_role("button", name="Request key").click()
        _flash(alice, "Key “checkout-service” requested.")
        expect(alice.get_by_text("Waiting for a governance officer")).to_be_visible()
        key_page = alice.url

        # olivia finds it in her queue and approves it.
        _nav(olivia, "Review queue")
        request_row = olivia.get_by_role("row").filter(has_text="checkout-service")
        expect(request_row).to_contain_text("The checkout service answers order questions.")
        olivia.screenshot(path=screenshot_dir / "officer-queue.png", full_page=True)
        request_row.get_by_role("button", name="Approve").click()
        _flash(olivia, "Key request “checkout-service” for acme/chatbot approved.")
        expect(olivia.get_by_text("No key requests are waiting.")).to_be_visible()

        # alice reveals it: once, on a page no cache keeps, and copies it.
        alice.goto(key_page)
        with alice.expect_response(lambda r: r.url.endswith("/reveal/")) as revealed:
            alice.get_by_role("button", name="Reveal key").click()
        assert "no-store" in revealed.value.headers["cache-control"]
        expect(
            alice.get_by_role("heading", name="Copy it now — it will not be shown again")
        ).to_be_visible()
        secret = alice.locator("#secret-key").inner_text().strip()
        assert secret.startswith("sk-sy-")
        assert len(secret) > 40
        alice.get_by_role("button", name="Copy key").click()
        expect(alice.locator("#copy-status")).to_have_text("Copied to the clipboard.")
        alice.screenshot(path=screenshot_dir / "reveal.png", full_page=True)
        assert alice.evaluate("navigator.clipboard.readText()") == secret

        # The key page now shows its prefix only, and no way to reveal it again.
        alice.goto(key_page)
        expect(alice.get_by_role("heading", level=1)).to_contain_text("Active")
        expect(alice.get_by_role("button", name="Reveal key")).to_have_count(0)
        assert secret not in alice.content()
        expect(alice.get_by_text(f"{secret[:12]}…").first).to_be_visible()
        alice.screenshot(path=screenshot_dir / "key-detail.png", full_page=True)

        # The gateway, a separate process, serves the key the browser revealed.
        assert wait_until(lambda: chat() == 200, timeout=GATEWAY_CATCH_UP_S)

        # olivia suspends the use case; the gateway refuses the key within seconds.
        _nav(olivia, "Use cases & keys")
        olivia.get_by_role("link", name="Chatbot").click()
        olivia.get_by_label("Reason (required)").fill("Incident 42: prompts leaking to logs")
        olivia.once("dialog", lambda dialog: dialog.accept())
        olivia.get_by_role("button", name="Suspend use case").click()
        _flash(olivia, "Use case acme/chatbot suspended")
        olivia.screenshot(path=screenshot_dir / "use-case-suspended.png", full_page=True)
        suspended_at = time.monotonic()
        assert wait_until(lambda: chat() == 401, timeout=GATEWAY_CATCH_UP_S)
        assert time.monotonic() - suspended_at < GATEWAY_CATCH_UP_S
    except Exception:
        alice.screenshot(path=screenshot_dir / "failed-alice.png", full_page=True)
        olivia.screenshot(path=screenshot_dir / "failed-olivia.png", full_page=True)
        print(f"screenshots of the failure: {screenshot_dir}")
        raise
    finally:
        alice_context.close()
        olivia_context.close()
    print(f"screenshots: {screenshot_dir}")
