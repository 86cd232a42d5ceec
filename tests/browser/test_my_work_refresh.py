"""My work in Chromium: the async tasks table refreshes itself (htmx) while a task is queued
or running, and stops once every task has ended — with a real gateway taking the tasks and a
real batcher running them on the vLLM simulator.

GIVEN alice (developer of acme) with two tasks queued through the gateway, no batcher yet
WHEN she opens My work and a batcher then starts
THEN the rows go from queued to done on the open page, without a reload, a done row links to
its result, and the table stops asking for updates.
"""

from __future__ import annotations

import valkey
from openai import OpenAI
from playwright.sync_api import Browser, expect

from gateway.async_tasks.client import AsyncTaskClient
from governance.roles import Role
from testkit.axe import accessibility_violations
from testkit.browser import sign_in
from testkit.factories import make_tenant, make_use_case, make_user
from testkit.policy import PolicyBuilder
from tests.conftest import BatcherFactory, GatewayFactory, SimulatorFactory

EMBED = "embed"
RUN_MS = 30_000  # the batcher's start and the tasks' run: generous, CPUs are shared


def test_the_tasks_table_follows_queued_tasks_to_done_by_itself(
    browser: Browser,
    portal_server: str,
    settings: object,
    valkey_url: str,
    valkey_client: valkey.Valkey,
    start_simulator: SimulatorFactory,
    start_gateway: GatewayFactory,
    start_batcher: BatcherFactory,
) -> None:
    settings.VALKEY_URL = valkey_url  # type: ignore[attr-defined]  # the live server's too
    embed = start_simulator(EMBED, "--kind", "embedding", "--time-scale", "0")
    policy = PolicyBuilder().model(EMBED, [embed.base_url], capabilities=("embeddings",))
    key = policy.key(tenant="acme", use_case="search")
    policy.publish(valkey_client)
    acme = make_tenant("acme")
    make_use_case(acme, "search", pk=policy.use_case_id(key))
    make_user("alice", Role.DEVELOPER, tenants=(acme,))
    gateway = start_gateway()
    tasks = AsyncTaskClient(OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0))
    submitted = [
        tasks.submit("embeddings", {"model": EMBED, "input": text}).id for text in ("a", "b")
    ]

    context = browser.new_context(base_url=portal_server)
    context.set_default_timeout(10_000)
    try:
        page = context.new_page()
        sign_in(page, "alice")
        page.get_by_role("navigation", name="Main").get_by_role("link", name="My work").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("My work")
        table = page.locator("#work-tasks")
        expect(table).to_have_attribute("data-refreshing", "true")
        for task_id in submitted:
            expect(table.locator(f'tr[data-task="{task_id}"]')).to_have_attribute(
                "data-status", "queued"
            )
        assert accessibility_violations(page) == []
        page.evaluate("() => { window.sameDocument = true; }")  # gone if the page reloads

        start_batcher()
        for task_id in submitted:
            expect(table.locator(f'tr[data-task="{task_id}"]')).to_have_attribute(
                "data-status", "done", timeout=RUN_MS
            )
        expect(page.locator("#work-tasks")).to_have_attribute("data-refreshing", "false")
        assert page.evaluate("() => window.sameDocument === true")

        row = page.locator(f'tr[data-task="{submitted[0]}"]')
        with page.expect_response(lambda r: submitted[0] in r.url) as answer:
            row.get_by_role("link", name="Result (JSON)").click()
        assert answer.value.status == 200
        assert answer.value.json()["status"] == "done"
    finally:
        context.close()
