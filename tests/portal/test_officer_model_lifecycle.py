"""A model's deprecation in the portal (docs/models.md): olivia, a governance officer,
deprecates llama for llama-2 through the model form (planned, then applied and audited); the
models page lists the use cases still calling llama with their recent volume; alice, who
develops acme's chatbot, sees the notice on her use case's page, and the chatbot's webhook is
told once, through a real Celery worker, signed with the use case's secret."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
import pytest
from django.utils import timezone

from governance.audit import Actor
from governance.models import AuditEvent, Model, UseCase
from governance.roles import Role
from governance.services.generic_records import record_update
from ops.processes import ManagedProcess, wait_until
from records.models import UsageMinute
from runtime.valkey_urls import for_kombu
from scheduler.files.webhook_settings import webhook_set
from scheduler.model_notices import model_notice_deliver
from testkit.factories import make_model, make_tenant, make_use_case, make_user
from testkit.file_jobs_world import (
    RECEIVER_ENV,
    WebhookReceiver,
    allow_receivers,
    verify_standard_webhook,
)
from tests.portal.test_officer_support import apply, client_for, plan_cells, review, text, url

pytestmark = pytest.mark.django_db

NOTICE = "https://docs.example.com/models/llama-sunset"


@pytest.fixture
def world() -> dict[str, Any]:
    llama = make_model("llama", capabilities=["chat"])
    llama_2 = make_model("llama-2", capabilities=["chat"])
    acme = make_tenant("acme")
    chatbot = make_use_case(acme, "chatbot", models=(llama,))
    search = make_use_case(acme, "search", models=(llama,))
    return {"llama": llama, "llama_2": llama_2, "chatbot": chatbot, "search": search, "acme": acme}


def form(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "public_id": "llama",
        "description": "",
        "capabilities": ["chat"],
        "timeout_seconds": "60",
        "max_tokens": "",
        "status": "deprecated",
        "sunset_at": "2031-03-01 00:00",
        "successor": "llama-2",
        "notice_url": NOTICE,
        "at_sunset": "successor",
    }
    data.update(changes)
    return data


def test_an_officer_deprecates_a_model_in_the_portal_plan_first(world: dict[str, Any]) -> None:
    olivia = client_for("olivia", Role.OFFICER)
    edit = url("model_edit", world["llama"].pk)
    html = review(olivia, edit, form())

    assert {(c.field, c.before, c.after) for c in plan_cells(html)} == {
        ("lifecycle.status", '"active"', '"deprecated"'),
        ("lifecycle.sunset_at", "—", '"2031-03-01T00:00:00Z"'),
        ("lifecycle.successor", "—", '"llama-2"'),
        ("lifecycle.notice_url", '""', f'"{NOTICE}"'),
        ("lifecycle.at_sunset", '"refuse"', '"successor"'),
    }
    assert Model.objects.get(public_id="llama").status == "active"  # reviewing saves nothing

    assert apply(olivia, edit, form(), html).status_code == 302
    llama = Model.objects.get(public_id="llama")
    assert (llama.status, llama.at_sunset, llama.notice_url) == ("deprecated", "successor", NOTICE)
    assert llama.successor == world["llama_2"]
    assert AuditEvent.objects.filter(action="model.deprecated", actor="olivia").count() == 1
    # The form shows it as stored, and the same form again plans nothing.
    again = review(olivia, edit, form())
    assert plan_cells(again) == []


def test_a_deprecation_without_a_sunset_is_refused_on_its_field(world: dict[str, Any]) -> None:
    olivia = client_for("olivia", Role.OFFICER)
    response = olivia.post(
        url("model_edit", world["llama"].pk), {**form(sunset_at=""), "step": "review"}
    )
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert "sunset_at" in errors, errors
    assert not AuditEvent.objects.exists()


def test_the_models_page_lists_who_still_calls_a_deprecated_model(world: dict[str, Any]) -> None:
    olivia_actor = Actor.for_user(make_user("oscar", Role.OFFICER))
    record_update(
        actor=olivia_actor,
        instance=world["llama"],
        changes={
            "status": "deprecated",
            "sunset_at": timezone.now() + timedelta(days=30),
            "successor": world["llama_2"],
        },
    )
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(hours=1)
    UsageMinute.objects.create(
        use_case_id=world["chatbot"].pk,
        tenant="acme",
        model="llama",
        minute=minute,
        requests=42,
        prompt_tokens=1000,
        completion_tokens=234,
    )
    UsageMinute.objects.create(  # older than the window: not recent volume
        use_case_id=world["chatbot"].pk,
        tenant="acme",
        model="llama",
        minute=minute - timedelta(days=30),
        requests=999,
    )
    page = client_for("olivia", Role.OFFICER).get(url("models")).content.decode()

    callers = page[page.index("Use cases still calling llama") :]
    callers = callers[: callers.index("</table>")]
    rows = [text(row) for row in callers.split("<tr>")[2:]]
    assert rows[0].startswith("acme/chatbot 42 1234"), rows
    assert rows[1].startswith("acme/search 0 0 none (approved)"), rows
    assert len(rows) == 2
    assert "Use cases still calling llama-2" not in page  # an active model: no such table


def test_the_owners_see_the_notice_on_their_use_case(world: dict[str, Any]) -> None:
    record_update(
        actor=Actor.for_user(make_user("olivia", Role.OFFICER)),
        instance=world["llama"],
        changes={
            "status": "deprecated",
            "sunset_at": timezone.now() + timedelta(days=30),
            "successor": world["llama_2"],
            "notice_url": NOTICE,
        },
    )
    alice = client_for("alice", Role.DEVELOPER, tenants=(world["acme"],))
    page = alice.get(url("use_case_detail", world["chatbot"].pk)).content.decode()
    notice = text(page[page.index('id="model-notices-heading"') :].split("</section>")[0])
    assert "llama is deprecated: its sunset is" in notice
    assert "Move to llama-2 ; after the sunset requests for it are refused (410)." in notice
    assert f'href="{NOTICE}"' in page


def test_the_webhook_delivery_is_signed_and_says_what_to_move_to(
    world: dict[str, Any], settings: Any
) -> None:
    allow_receivers(settings)
    chatbot: UseCase = world["chatbot"]
    with WebhookReceiver() as receiver:
        secret = webhook_set(actor=Actor.system("tests"), use_case=chatbot, url=receiver.url)
        assert secret is not None
        model = record_update(
            actor=Actor.for_user(make_user("olivia", Role.OFFICER)),
            instance=world["llama"],
            changes={
                "status": "deprecated",
                "sunset_at": timezone.now() + timedelta(days=30),
                "successor": world["llama_2"],
            },
        )
        assert model_notice_deliver(model.pk, chatbot.pk, "msg_x") == "delivered"
        # The search use case has no webhook: nothing is sent for it.
        assert model_notice_deliver(model.pk, world["search"].pk, "msg_y") == "no_webhook"
    [(headers, body)] = receiver.received
    assert verify_standard_webhook(secret, headers, body)
    event = orjson.loads(body)
    assert event["type"] == "model.deprecated"
    assert event["data"]["model"] == "llama"
    assert event["data"]["successor"] == "llama-2"
    assert event["data"]["use_case"] == "acme/chatbot"


@pytest.mark.django_db(transaction=True)  # the worker's connection sees committed rows only
def test_deprecating_tells_each_webhook_once_through_a_real_worker(
    valkey_url: str, start_celery_worker: Any, settings: Any
) -> None:
    from config.celery import app

    allow_receivers(settings)
    worker: ManagedProcess = start_celery_worker(**RECEIVER_ENV)
    app.conf.update(broker_url=for_kombu(valkey_url), result_backend=for_kombu(valkey_url))
    llama = make_model("llama", capabilities=["chat"])
    llama_2 = make_model("llama-2", capabilities=["chat"])
    acme = make_tenant("acme")
    chatbot = make_use_case(acme, "chatbot", models=(llama,))
    make_use_case(acme, "search", models=(llama,))  # no webhook
    with WebhookReceiver() as receiver:
        secret = webhook_set(actor=Actor.system("tests"), use_case=chatbot, url=receiver.url)
        assert secret is not None
        olivia = Actor.for_user(make_user("olivia", Role.OFFICER))
        record_update(
            actor=olivia,
            instance=llama,
            changes={
                "status": "deprecated",
                "sunset_at": timezone.now() + timedelta(days=30),
                "successor": llama_2,
            },
        )
        # A later change to the same deprecation is not a new notice.
        record_update(actor=olivia, instance=llama, changes={"notice_url": NOTICE})
        assert wait_until(lambda: len(receiver.received) >= 1, timeout=30), worker.log_tail()
        assert wait_until(lambda: "deliver_model_notice" in worker.log_text(), timeout=10)
    [(headers, body)] = receiver.received
    assert verify_standard_webhook(secret, headers, body)
    assert headers["webhook-id"].startswith(f"msg_model_{llama.pk}_deprecated_")
    assert orjson.loads(body)["data"]["successor"] == "llama-2"
