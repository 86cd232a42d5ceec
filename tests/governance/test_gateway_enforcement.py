"""Governance decisions reach the gateway — a separate process — within seconds.

GIVEN a key revealed through the API and a running gateway in front of a simulator replica,
WHEN an officer suspends the use case (or the developer revokes the key) through the API,
THEN the gateway refuses the key within a few seconds, without restarting anything.
"""

from __future__ import annotations

import httpx
import pytest
from rest_framework.test import APIClient

from governance.roles import Role
from governance.snapshot import snapshot_publish
from ops.processes import wait_until
from testkit.factories import make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def running(live_valkey_settings, start_simulator, start_gateway):
    replica = start_simulator("llama", "--time-scale", "0")
    acme = make_tenant("acme")
    use_case = make_use_case(
        acme, "chatbot", models=(make_model("llama", replicas=[replica.base_url]),)
    )
    alice, olivia = APIClient(), APIClient()
    alice.force_authenticate(make_user("alice", Role.DEVELOPER, tenants=(acme,)))
    olivia.force_authenticate(make_user("olivia", Role.OFFICER))
    key_id = alice.post(
        "/api/api-keys/", {"use_case": use_case.pk, "name": "ci", "reason": "CI"}, format="json"
    ).data["id"]
    olivia.post(f"/api/api-keys/{key_id}/approve/", {}, format="json")
    secret = alice.post(f"/api/api-keys/{key_id}/reveal/").data["secret"]
    snapshot_publish()  # the gateway needs a snapshot before it reports ready
    gateway = start_gateway()
    return {
        "gateway": gateway,
        "secret": secret,
        "key_id": key_id,
        "use_case": use_case,
        "alice": alice,
        "olivia": olivia,
    }


def chat(running) -> int:
    return httpx.post(
        running["gateway"].base_url + "/v1/chat/completions",
        json={"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={"Authorization": f"Bearer {running['secret']}"},
    ).status_code


def test_suspending_a_use_case_stops_its_keys_at_the_gateway(running) -> None:
    assert chat(running) == 200
    suspended = running["olivia"].post(
        f"/api/use-cases/{running['use_case'].pk}/suspend/", {"reason": "incident 7"}, format="json"
    )
    assert suspended.status_code == 200
    assert wait_until(lambda: chat(running) == 401, timeout=5)
    running["olivia"].post(f"/api/use-cases/{running['use_case'].pk}/reinstate/", {}, format="json")
    assert wait_until(lambda: chat(running) == 200, timeout=5)


def test_revoking_a_key_stops_it_at_the_gateway(running) -> None:
    assert chat(running) == 200
    running["alice"].post(
        f"/api/api-keys/{running['key_id']}/revoke/", {"reason": "leaked"}, format="json"
    )
    assert wait_until(lambda: chat(running) == 401, timeout=5)
