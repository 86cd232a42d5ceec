"""The embedded demo prices its fleet, so that its spend charts and My usage show spend.

Seeded with the fleet ``make up`` starts (ops/stack.py); alice is a developer of the demo
tenant, olivia a governance officer who sets a price of her own.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from django.test import Client
from django.utils import timezone

from governance.audit import Actor
from governance.models import AuditEvent, Model, Tenant, UseCase
from governance.prices import amount_text, model_price_add, moment_text, price_in_force
from governance.roles import Role
from ops.demo import DEMO_PRICES_FROM, FleetModel, demo_seed
from ops.stack import DEMO_FLEET
from records.models import UsageMinute
from testkit.factories import make_user

pytestmark = pytest.mark.django_db

FLEET = [
    FleetModel(m.public_id, m.capabilities.split("+"), [f"http://127.0.0.1:{8101 + i}"])
    for i, m in enumerate(DEMO_FLEET)
]


def prices() -> dict[str, list[tuple[str, str, str]]]:
    return {
        model.public_id: [
            (
                moment_text(p.effective_from),
                amount_text(p.input_per_mtok),
                amount_text(p.output_per_mtok),
            )
            for p in model.prices.order_by("effective_from")
        ]
        for model in Model.objects.order_by("public_id")
    }


def test_every_demo_model_has_a_price_in_force_since_before_any_demo_usage(
    live_valkey_settings,
) -> None:
    demo_seed(fleet=FLEET, admin_password="pw-one-123")

    assert prices() == {
        "llama-3.1-8b-instruct": [(DEMO_PRICES_FROM, "0.2", "0.6")],
        "llama-guard-3-1b": [(DEMO_PRICES_FROM, "0.05", "0.05")],
        "minilm-l6-embed": [(DEMO_PRICES_FROM, "0.02", "0")],
        "whisper-large-v3": [(DEMO_PRICES_FROM, "0.5", "0.5")],
    }
    audited = AuditEvent.objects.filter(action="modelprice.create")
    assert sorted(audited.values_list("actor", flat=True)) == ["system:demo-seed"] * 4


def test_seeding_again_keeps_the_prices_an_officer_set(live_valkey_settings) -> None:
    demo_seed(fleet=FLEET, admin_password="pw-one-123")
    olivia = make_user("olivia", Role.OFFICER)
    llama = Model.objects.get(public_id="llama-3.1-8b-instruct")

    later = timezone.now() + timedelta(days=7)
    model_price_add(
        actor=Actor(username="olivia", user=olivia),
        model=llama,
        effective_from=later,
        input_per_mtok="0.3",
        output_per_mtok="0.9",
    )
    before = prices()

    demo_seed(fleet=FLEET, admin_password="pw-one-123")

    assert prices() == before
    assert len(before["llama-3.1-8b-instruct"]) == 2
    assert AuditEvent.objects.filter(action="modelprice.create").count() == 5


def test_the_demo_assistants_usage_shows_as_spend_in_my_usage(live_valkey_settings) -> None:
    """GIVEN the demo seeded and a million prompt and a million completion tokens of the chat
    model used by the demo assistant this month WHEN alice opens My usage THEN it shows their
    spend at the demo's price, 0.20 + 0.60, with nothing left unpriced."""
    demo_seed(fleet=FLEET, admin_password="pw-one-123")
    assistant = UseCase.objects.get(slug="demo-assistant")
    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    UsageMinute.objects.create(
        use_case_id=assistant.pk,
        tenant="demo",
        model="llama-3.1-8b-instruct",
        minute=minute,
        requests=3,
        prompt_tokens=1_000_000,
        completion_tokens=1_000_000,
    )
    assert price_in_force(model="llama-3.1-8b-instruct", at=minute) is not None
    alice = make_user("alice", Role.DEVELOPER, tenants=(Tenant.objects.get(slug="demo"),))
    client = Client()
    client.force_login(cast(Any, alice))

    html = client.get("/my-usage/").content.decode()

    spend = re.search(rf'<p data-spend="{assistant.pk}"><strong>([^<]+)</strong>', html)
    assert spend is not None, html
    assert spend.group(1) == "0.80 EUR"
    assert f'data-unpriced="{assistant.pk}"' not in html
