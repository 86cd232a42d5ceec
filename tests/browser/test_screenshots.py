"""Screenshots of each main page, as the person whose job it is, for docs/portal.md.

GIVEN a small bank: two tenants, three use cases with guardrails, keys active and pending,
records, admission decisions and guardrail findings,
WHEN olivia (officer), alice (developer of acme) and avery (auditor) each open their pages,
THEN every page answers 200 with its own heading and no serious accessibility violation, and
its screenshot is written: into docs/screenshots/ when SWITCHYARD_SCREENSHOTS=1 (run it so,
then commit the images), otherwise into pytest's temp dir.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from gateway.async_tasks.layout import task as task_key
from governance.audit import Actor
from governance.models import GuardrailSelection
from governance.prices import model_price_add
from governance.roles import Role
from governance.services.api_keys import api_key_request
from ops.processes import REPO_ROOT
from records.models import AdmissionDecision, GuardrailFinding, GuardrailHour, UsageMinute
from testkit.axe import accessibility_violations
from testkit.browser import sign_in
from testkit.factories import make_key, make_model, make_tenant, make_use_case, make_user
from testkit.records import make_record

pytestmark = pytest.mark.django_db(transaction=True)

VIEWPORT = {"width": 1280, "height": 800}


@dataclass(frozen=True)
class Shot:
    """One page: who opens it, where, the file it becomes and the heading that proves it."""

    username: str
    path: str
    name: str
    heading: str


@pytest.fixture
def shots_dir(tmp_path: Path) -> Path:
    if os.environ.get("SWITCHYARD_SCREENSHOTS") == "1":
        directory = Path(REPO_ROOT) / "docs" / "screenshots"
    else:
        directory = tmp_path / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture
def bank() -> dict[str, str]:
    """The world the screenshots show; the ids the paths need."""
    llama, mistral = make_model("llama-3.1-8b"), make_model("mistral-7b")
    acme = make_tenant("acme")
    globex = make_tenant("globex")
    chatbot = make_use_case(acme, "support-chatbot", models=(llama, mistral))
    make_use_case(acme, "claims-summary", models=(llama,))
    make_use_case(globex, "fraud-notes", models=(mistral,), status="submitted")
    alice = make_user("alice", Role.DEVELOPER, tenants=(acme,))
    olivia = make_user("olivia", Role.OFFICER)
    make_user("avery", Role.AUDITOR)
    for model, prices in ((llama, ("0.20", "0.60")), (mistral, ("0.15", "0.45"))):
        model_price_add(
            actor=Actor.for_user(olivia),
            model=model,
            effective_from="2025-01-01T00:00:00+00:00",
            input_per_mtok=prices[0],
            output_per_mtok=prices[1],
        )
    active, _ = make_key(chatbot, name="checkout-service")
    pending = api_key_request(
        actor=Actor.for_user(alice), use_case=chatbot, name="alice-ci", reason="CI smoke tests"
    )
    GuardrailSelection.objects.create(
        use_case=chatbot, guardrail="pii", side="both", action="redact", config={"entities": []}
    )
    now = timezone.now()
    where = {"use_case_id": chatbot.pk, "tenant_id": acme.pk, "tenant": "acme"}
    GuardrailFinding.objects.create(
        stream_id="1-0",
        request_id="req-7",
        occurred_at=now,
        model="llama-3.1-8b",
        stage="request",
        guardrail="pii",
        action="redacted",
        entities={"EMAIL_ADDRESS": 1},
        score=0.93,
        **where,
    )
    GuardrailHour.objects.create(
        guardrail="pii",
        action="redacted",
        hour=now.replace(minute=0, second=0, microsecond=0),
        findings=1,
        **where,
    )
    for n, (decision, reason) in enumerate(
        [("admitted", ""), ("queued", ""), ("rejected", "tokens_per_minute"), ("shed", "")]
    ):
        AdmissionDecision.objects.create(
            stream_id=f"{n + 1}-0",
            request_id=f"req-{n + 1}",
            occurred_at=now - timedelta(seconds=30 * n),
            decision=decision,
            reason=reason,
            key_id=active.pk,
            model="llama-3.1-8b",
            queued_ms=120 * n,
            **where,
        )
    # A day of traffic, so the tokens and spend charts have something to show: every 20
    # minutes, more by day than by night, on both models.
    start = now.replace(second=0, microsecond=0) - timedelta(hours=24)
    for step in range(72):
        at = start + timedelta(minutes=20 * step)
        busy = 3 if 7 <= at.hour <= 18 else 1
        for model_id, share in (("llama-3.1-8b", 4), ("mistral-7b", 1)):
            UsageMinute.objects.create(
                use_case_id=chatbot.pk,
                tenant="acme",
                model=model_id,
                minute=at,
                requests=10 * busy * share,
                prompt_tokens=4_000 * busy * share,
                completion_tokens=1_500 * busy * share,
                queued_ms=30 * busy,
                total_ms=900 * busy * share,
            )
    record = ""
    for minute in range(3):
        record = make_record(
            chatbot, minutes=minute, key_id=active.pk, model="llama-3.1-8b"
        ).record_id
    make_record(chatbot, minutes=4, status=429, key_id=active.pk, model="llama-3.1-8b")
    return {
        "use_case": str(chatbot.pk),
        "active_key": str(active.pk),
        "pending_key": str(pending.pk),
        "record": record,
        "model": str(llama.pk),
    }


def _shots(ids: dict[str, str]) -> list[Shot]:
    use_case = f"/use-cases/{ids['use_case']}/"
    return [
        Shot("olivia", "/dashboard/", "officer-dashboard", "Use cases & keys"),
        Shot("olivia", "/review/", "officer-review-queue", "Review queue"),
        Shot("olivia", use_case, "officer-use-case", "Support-Chatbot"),
        Shot("olivia", "/admission-decisions/", "officer-admission-decisions", "Admission"),
        Shot("olivia", "/guardrail-findings/", "officer-guardrail-findings", "Guardrail"),
        Shot("olivia", "/govern/", "officer-governance", "Governance"),
        Shot("olivia", "/govern/use-cases/new/", "officer-new-use-case", "use case"),
        Shot("olivia", "/govern/priority-matrix/", "officer-priority-matrix", "matrix"),
        Shot("olivia", f"{use_case}usage/", "officer-usage-charts", "Usage of"),
        Shot("olivia", "/govern/models/", "officer-models", "Models"),
        Shot("olivia", f"/govern/models/{ids['model']}/edit/", "officer-model", "llama-3.1-8b"),
        Shot("alice", "/dashboard/", "developer-dashboard", "My use cases & keys"),
        Shot("alice", use_case, "developer-use-case", "Support-Chatbot"),
        Shot("alice", f"{use_case}keys/new/", "developer-key-request", "key"),
        Shot("alice", f"/keys/{ids['pending_key']}/", "developer-key", "alice-ci"),
        Shot("alice", "/my-usage/", "developer-my-usage", "My usage"),
        Shot("alice", "/use-cases/new/", "developer-request-use-case", "Request a use case"),
        Shot("alice", "/my-work/", "developer-my-work", "My work"),
        Shot("avery", "/audit/", "auditor-audit-trail", "Audit trail"),
        Shot("avery", "/records/", "auditor-records", "Records"),
        Shot("avery", f"/records/{ids['record']}/", "auditor-record", "record"),
    ]


def _sign_in(browser: Browser, base_url: str, username: str) -> Page:
    page = browser.new_context(base_url=base_url, viewport=VIEWPORT).new_page()  # type: ignore[arg-type]
    page.set_default_timeout(10_000)
    sign_in(page, username)
    return page


@pytest.fixture
def tasks(bank: dict[str, str], settings: Any, valkey_client: Any, valkey_url: str) -> None:
    """A few async tasks of the chatbot in the task store My work reads (gateway/async_tasks
    /layout.py's hash, as the gateway and batcher write it)."""
    settings.VALKEY_URL = valkey_url
    now_ms = int(timezone.now().timestamp() * 1000)
    for n, (status, model, endpoint) in enumerate(
        [
            ("running", "llama-3.1-8b", "/v1/chat/completions"),
            ("queued", "llama-3.1-8b", "/v1/chat/completions"),
            ("done", "mistral-7b", "/v1/embeddings"),
            ("failed", "llama-3.1-8b", "/v1/chat/completions"),
        ]
    ):
        created = now_ms - 60_000 * (n + 1)
        fields = {
            "status": status,
            "use_case_id": bank["use_case"],
            "tenant": "acme",
            "model": model,
            "endpoint": endpoint,
            "created_ms": created,
            "deadline_ms": created + 3_600_000,
            "attempts": 3 if status == "failed" else 1,
            "finished_ms": created + 40_000 if status in ("done", "failed") else 0,
        }
        if status == "failed":
            fields["error"] = '{"message": "The replica answered 500 three times."}'
        valkey_client.hset(task_key(f"task_screenshot{n}"), mapping=fields)


def test_each_main_page_is_photographed_as_the_role_that_uses_it(
    browser: Browser, portal_server: str, bank: dict[str, str], tasks: None, shots_dir: Path
) -> None:
    shots = _shots(bank)
    written: list[Path] = []
    inaccessible: list[str] = []
    pages: dict[str, Page] = {}
    try:
        for shot in shots:
            if shot.username not in pages:
                pages[shot.username] = _sign_in(browser, portal_server, shot.username)
            page = pages[shot.username]
            if shot.name == "auditor-audit-trail":
                # Show the chain verified, as an auditor would see it after the button.
                page.goto(shot.path)
                page.get_by_role("button", name="Verify chain").click()
                expect(page.locator("#chain-status")).to_contain_text("Verified up to event #")
            response = page.goto(shot.path)
            assert response is not None
            assert response.status == 200, f"{shot.path} as {shot.username}: {response.status}"
            page.wait_for_load_state("networkidle")
            expect(page.get_by_role("heading", level=1)).to_contain_text(
                shot.heading, ignore_case=True
            )
            inaccessible += accessibility_violations(page)
            target = shots_dir / f"{shot.name}.png"
            page.screenshot(path=str(target), full_page=True)
            written.append(target)
    finally:
        for page in pages.values():
            page.context.close()

    assert inaccessible == [], "\n".join(inaccessible)
    assert [path.name for path in written] == [f"{shot.name}.png" for shot in shots]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
        assert path.stat().st_size > 10_000, f"{path} is suspiciously small"
