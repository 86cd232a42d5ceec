"""A use case's async task settings (docs/async.md): how long a result stays readable and the
result cache. Officers set them through the API; the snapshot carries them to the gateway
(which writes the result lifetime into each task) and the batcher (which keeps the cache).

Personas: alice develops for acme, olivia is an officer.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from rest_framework.test import APIClient

from gateway.policy import SNAPSHOT_KEY, parse_snapshot
from governance.choices import UseCaseStatus
from governance.models import AuditEvent, UseCase
from governance.roles import Role
from governance.snapshot import snapshot_publish
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> dict[str, Any]:
    acme = make_tenant("acme")
    chatbot = make_use_case(acme, "chatbot", models=(make_model("llama"),))
    clients = {}
    for name, role, tenants in (
        ("alice", Role.DEVELOPER, (acme,)),
        ("olivia", Role.OFFICER, ()),
    ):
        client = APIClient()
        client.force_authenticate(make_user(name, role, tenants=tenants))
        clients[name] = client
    return {"chatbot": chatbot, **clients}


def test_a_use_case_keeps_results_ten_minutes_without_a_cache_by_default(world) -> None:
    shown = world["alice"].get(f"/api/use-cases/{world['chatbot'].pk}/").data
    assert shown["async_result_ttl_seconds"] == 600
    assert shown["async_cache_seconds"] == 0


def test_an_officer_sets_them_audited_and_the_snapshot_carries_them(
    world, live_valkey_settings, valkey_client
) -> None:
    url = f"/api/use-cases/{world['chatbot'].pk}/"
    changed = world["olivia"].patch(
        url, {"async_result_ttl_seconds": 3600, "async_cache_seconds": 120}, format="json"
    )
    assert changed.status_code == 200, changed.data
    event = AuditEvent.objects.get(action="usecase.update")
    assert event.before is not None
    assert event.after is not None
    assert (event.before["async_result_ttl_seconds"], event.after["async_result_ttl_seconds"]) == (
        600,
        3600,
    )
    assert UseCase.objects.get(pk=world["chatbot"].pk).status == UseCaseStatus.APPROVED
    snapshot_publish(client=valkey_client)
    raw = valkey_client.get(SNAPSHOT_KEY)
    assert isinstance(raw, bytes)
    published = parse_snapshot(raw).use_cases[world["chatbot"].pk]
    assert (published.async_result_ttl_s, published.async_cache_s) == (3600, 120)
    assert published.async_signed_callbacks is False
    assert orjson.loads(raw)["use_cases"][str(world["chatbot"].pk)]["async_tasks"] == {
        "result_ttl_s": 3600,
        "cache_s": 120,
        "signed_callbacks": False,
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("async_result_ttl_seconds", 5),
        ("async_result_ttl_seconds", 86_401),
        ("async_cache_seconds", -1),
        ("async_cache_seconds", 86_401),
    ],
)
def test_out_of_range_values_are_a_400_naming_the_field(world, field: str, value: int) -> None:
    refused = world["olivia"].patch(
        f"/api/use-cases/{world['chatbot'].pk}/", {field: value}, format="json"
    )
    assert refused.status_code == 400
    assert field in refused.data
    defaults = {"async_result_ttl_seconds": 600, "async_cache_seconds": 0}
    assert getattr(UseCase.objects.get(pk=world["chatbot"].pk), field) == defaults[field]


def test_developers_may_not_set_them(world) -> None:
    refused = world["alice"].patch(
        f"/api/use-cases/{world['chatbot'].pk}/", {"async_cache_seconds": 60}, format="json"
    )
    assert refused.status_code == 403
    assert UseCase.objects.get(pk=world["chatbot"].pk).async_cache_seconds == 0
