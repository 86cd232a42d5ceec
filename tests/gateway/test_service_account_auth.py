"""Keycloak service-account tokens on /v1, end to end: a real gateway process, a real fleet
watcher and simulator replica, a real Valkey, and the real OIDC provider (Keycloak's URL
layout, testkit/oidc) minting client-credentials tokens.

acme's use case "assistant" has alice's API key and is bound to the switchyard-automation
client; switchyard-roleless is a client of the realm bound to no use case. Tokens the realm
will not issue (expired, another issuer, a person's) are signed with the realm's own key, so
that only the claim under test is wrong.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
import openai
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.accounting import DECISIONS_STREAM, USAGE_STREAM
from gateway.scheduling import keys
from ops.processes import free_port, wait_until
from testkit.oidc import (
    API_AUDIENCE,
    AUTOMATION_CLIENT,
    OTHER_RESOURCE,
    ROLELESS_CLIENT,
    ROLELESS_SECRET,
    Provider,
    start_provider,
)
from testkit.policy import PolicyBuilder
from testkit.stack import RunningGateway
from tests.conftest import GatewayFactory, SimulatorFactory

MODEL = "llama-test"
STRANGER = "switchyard-stranger"  # a client the gateway's allow-list does not name
WINDOW_S = 60


@pytest.fixture(scope="module")
def realm(tmp_path_factory) -> Iterator[Provider]:
    started = start_provider(tmp_path_factory.mktemp("oidc"))
    try:
        yield started
    finally:
        started.stop()


def realm_env(provider: Provider, **extra: str) -> dict[str, str]:
    """The gateway's environment for a realm: the same variables as the web process's."""
    return {
        "SWITCHYARD_OIDC_ISSUER": provider.issuer,
        "SWITCHYARD_OIDC_API_CLIENTS": f"{AUTOMATION_CLIENT},{ROLELESS_CLIENT}",
        **extra,
    }


@dataclass
class World:
    gateway: RunningGateway
    policy: PolicyBuilder
    alice: str  # the API key of acme/assistant
    use_case_id: int


WorldFactory = Callable[..., World]


@pytest.fixture
def make_world(
    valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> WorldFactory:
    def make(
        provider: Provider,
        *,
        limits: dict[str, int] | None = None,
        time_scale: str = "0.01",
        max_in_flight_per_replica: int | None = None,
        **env: str,
    ) -> World:
        replica = start_simulator(MODEL, "--time-scale", time_scale)
        policy = PolicyBuilder().model(
            MODEL, [replica.base_url], max_in_flight_per_replica=max_in_flight_per_replica
        )
        policy.priority_class("standard", rank=2)
        alice = policy.key(tenant="acme", use_case="assistant", priority_class="standard")
        policy.service_account(AUTOMATION_CLIENT, like=alice)
        if limits:
            policy.use_case_limits(alice, **limits)
        policy.publish(valkey_client)
        gateway = start_gateway(**realm_env(provider, **env))
        return World(gateway, policy, alice, policy.use_case_id(alice))

    return make


def chat(
    gateway: RunningGateway, credential: str, *, request_id: str | None = None, **body: Any
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {credential}"}
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(
        gateway.base_url + "/v1/chat/completions",
        json={**payload, **body},
        headers=headers,
        timeout=30,
    )


def claims(provider: Provider, **changes: Any) -> dict[str, Any]:
    """A service-account token's claims as the realm issues them, with ``changes``."""
    now = int(time.time())
    return {
        "iss": provider.issuer,
        "aud": API_AUDIENCE,
        "sub": AUTOMATION_CLIENT,
        "azp": AUTOMATION_CLIENT,
        "client_id": AUTOMATION_CLIENT,
        "preferred_username": f"service-account-{AUTOMATION_CLIENT}",
        "iat": now,
        "exp": now + 300,
        **changes,
    }


def stream_entry(client, stream: str, request_id: str) -> dict[str, str] | None:
    for _, fields in client.xrange(stream):
        entry = {k.decode(): v.decode() for k, v in fields.items()}
        if entry["request_id"] == request_id:
            return entry
    return None


def refusal(response: httpx.Response) -> tuple[int, str, str]:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return response.status_code, error["code"], error["message"]


# --- a token works like a key of its use case ---------------------------------------------------
def test_a_service_account_token_gets_a_chat_completion_as_its_use_case(
    realm: Provider, make_world: WorldFactory, valkey_client
) -> None:
    """GIVEN switchyard-automation bound to acme/assistant
    WHEN it calls /v1 with a client-credentials token from the realm, through the OpenAI SDK
    THEN it gets its answer and its use case's models, and its usage record names the use
    case (and no key)."""
    world = make_world(realm)
    token = realm.client_credentials_token()
    client = openai.OpenAI(base_url=world.gateway.base_url + "/v1", api_key=token, max_retries=0)

    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=4,
        extra_headers={"X-Request-Id": "sa-first-call"},
    )
    assert reply.choices[0].message.content
    assert [m.id for m in client.models.list()] == [MODEL]

    assert wait_until(
        lambda: stream_entry(valkey_client, USAGE_STREAM, "sa-first-call") is not None, timeout=5
    )
    usage = stream_entry(valkey_client, USAGE_STREAM, "sa-first-call")
    assert usage is not None
    assert (usage["tenant"], usage["use_case_id"], usage["key_id"], usage["status"]) == (
        "acme",
        str(world.use_case_id),
        "",
        "200",
    )


def away_from_the_minute_boundary(margin_s: float) -> None:
    """Rate windows are wall-clock minutes: start only with ``margin_s`` of one left."""
    if WINDOW_S - time.time() % WINDOW_S < margin_s:
        assert wait_until(lambda: time.time() % WINDOW_S < 1, timeout=margin_s + 1, interval=0.02)


def test_a_token_and_a_key_of_one_use_case_share_its_rate_limit(
    realm: Provider, make_world: WorldFactory
) -> None:
    world = make_world(realm, limits={"requests_per_minute": 2})
    token = realm.client_credentials_token()
    away_from_the_minute_boundary(margin_s=8)

    statuses = [
        chat(world.gateway, world.alice).status_code,
        chat(world.gateway, token).status_code,
    ]
    over = chat(world.gateway, token)
    key_over = chat(world.gateway, world.alice)

    assert statuses == [200, 200]
    for response in (over, key_over):
        assert response.status_code == 429, response.text
        error = response.json()["error"]
        assert error["code"] == "rate_limit_exceeded"
        assert "use case assistant requests per minute" in error["message"]


@contextlib.contextmanager
def holding(gateway: RunningGateway, credential: str) -> Iterator[None]:
    """A long stream running on the model's only slot; leaving the block cuts it."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hold"}],
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST",
            gateway.base_url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {credential}"},
        ) as response,
    ):
        assert response.status_code == 200, response.read()
        lines = response.iter_lines()  # kept: a dropped generator would close the response
        assert next(lines).startswith("data: ")
        yield


def test_a_token_waits_in_the_queue_in_its_use_cases_class_like_a_key(
    realm: Provider, make_world: WorldFactory, valkey_client
) -> None:
    """GIVEN the model's one slot held by alice's key
    WHEN the service account calls
    THEN it waits in the model's queue in the use case's class, and is served once the slot
    frees; the decision is recorded against the use case."""
    world = make_world(realm, time_scale="1", max_in_flight_per_replica=1)
    token = realm.client_credentials_token()
    answers: dict[str, httpx.Response] = {}

    with holding(world.gateway, world.alice):
        waiter = threading.Thread(
            target=lambda: answers.update(sa=chat(world.gateway, token, request_id="sa-queued"))
        )
        waiter.start()
        assert wait_until(lambda: valkey_client.zcard(keys.queue(MODEL)) == 1, timeout=10)
    waiter.join(30)

    assert answers["sa"].status_code == 200, (
        f"{answers['sa'].text}\n{world.gateway.process.log_tail(40)}"
    )
    assert wait_until(
        lambda: stream_entry(valkey_client, DECISIONS_STREAM, "sa-queued") is not None, timeout=5
    )
    decision = stream_entry(valkey_client, DECISIONS_STREAM, "sa-queued")
    assert decision is not None
    assert (decision["decision"], decision["reason"]) == ("queued", "standard")
    assert (decision["use_case_id"], decision["key_id"]) == (str(world.use_case_id), "")
    assert int(decision["wait_ms"]) > 0


# --- refusals -----------------------------------------------------------------------------------
def test_tokens_that_must_not_work_get_a_401_saying_why(
    realm: Provider, make_world: WorldFactory
) -> None:
    world = make_world(realm)
    past = int(time.time()) - 600
    header, payload, signature = realm.client_credentials_token().split(".")
    tampered = f"{header}.{payload}.{('A' if signature[0] != 'A' else 'B') + signature[1:]}"
    tokens = {
        "expired": realm.sign(claims(realm, iat=past, exp=past + 300)),
        "wrong issuer": realm.sign(claims(realm, iss="http://127.0.0.1:1/realms/elsewhere")),
        "wrong audience": realm.client_credentials_token(resource=OTHER_RESOURCE),
        "person's token": realm.sign(claims(realm, preferred_username="alice", sub="a-person")),
        "unknown client": realm.sign(
            claims(
                realm,
                azp=STRANGER,
                client_id=STRANGER,
                preferred_username=f"service-account-{STRANGER}",
            )
        ),
        "unbound client": realm.client_credentials_token(ROLELESS_CLIENT, ROLELESS_SECRET),
        "tampered": tampered,
    }

    outcomes = {name: chat(world.gateway, token) for name, token in tokens.items()}

    expected = {
        "expired": "The bearer token has expired.",
        "wrong issuer": f"The bearer token was not issued by {realm.issuer}.",
        "wrong audience": "The bearer token is not meant for this API (its audience must "
        "include 'switchyard-api').",
        "person's token": "Only service-account tokens (client-credentials grant) are "
        "accepted on the API.",
        "unknown client": f"Client '{STRANGER}' may not use this API.",
        "unbound client": f"The service account of client '{ROLELESS_CLIENT}' is bound to no "
        "approved use case.",
        "tampered": "The bearer token's signature does not verify.",
    }
    assert {name: refusal(r) for name, r in outcomes.items()} == {
        name: (401, "invalid_api_key", message) for name, message in expected.items()
    }
    assert outcomes["expired"].headers["www-authenticate"].startswith("Bearer")
    with pytest.raises(openai.AuthenticationError, match="bound to no approved use case"):
        openai.OpenAI(
            base_url=world.gateway.base_url + "/v1",
            api_key=tokens["unbound client"],
            max_retries=0,
        ).models.list()


def test_a_suspended_use_case_stops_its_token_within_the_policy_refresh(
    realm: Provider, make_world: WorldFactory, valkey_client
) -> None:
    """GIVEN a token the gateway has verified (and remembers)
    WHEN the use case is suspended: the snapshot is republished without its key and client
    THEN the same token is refused at the gateway's next policy refresh (0.1 s here)."""
    world = make_world(realm)
    token = realm.client_credentials_token()
    assert chat(world.gateway, token).status_code == 200

    world.policy.revoke(world.alice)
    world.policy.unbind(AUTOMATION_CLIENT)
    world.policy.publish(valkey_client)
    suspended_at = time.monotonic()
    assert wait_until(lambda: chat(world.gateway, token).status_code == 401, timeout=5)

    assert time.monotonic() - suspended_at < 2.0
    assert "bound to no approved use case" in refusal(chat(world.gateway, token))[2]


# --- the identity provider's keys ---------------------------------------------------------------
def test_with_the_realm_down_known_keys_still_verify_and_a_new_kid_is_a_503(
    tmp_path, make_world: WorldFactory
) -> None:
    """GIVEN a gateway that fetched its realm's keys, and then the realm goes down
    WHEN tokens signed with the known key arrive, and then one naming a key never seen
    THEN the first work (keys are in memory), the new kid is 503 identity_provider_unavailable:
    its signing key cannot be fetched."""
    provider = start_provider(tmp_path / "oidc")
    try:
        world = make_world(provider)
        token = provider.client_credentials_token()
        assert chat(world.gateway, token).status_code == 200
    finally:
        provider.stop()

    assert chat(world.gateway, token).status_code == 200  # remembered
    fresh = provider.sign(claims(provider, jti="signed after the realm went down"))
    assert chat(world.gateway, fresh).status_code == 200  # verified with the key in memory

    rotated_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rotated = jwt.encode(
        claims(provider), rotated_key, algorithm="RS256", headers={"kid": "rotated-2"}
    )
    response = chat(world.gateway, rotated)
    assert refusal(response) == (
        503,
        "identity_provider_unavailable",
        "The identity provider's signing keys cannot be fetched right now. Retry shortly.",
    )
    assert response.headers["retry-after"].isdigit()


def test_a_gateway_that_cannot_reach_the_key_set_answers_503_not_401(
    realm: Provider, make_world: WorldFactory
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}/realms/switchyard/protocol/openid-connect/certs"
    world = make_world(realm, SWITCHYARD_OIDC_JWKS_ENDPOINT=nowhere)
    response = chat(world.gateway, realm.client_credentials_token())
    assert refusal(response)[:2] == (503, "identity_provider_unavailable")
    assert chat(world.gateway, world.alice).status_code == 200  # API keys never need the realm


def test_without_a_realm_a_jwt_is_just_an_incorrect_api_key(
    realm: Provider, valkey_client, start_simulator: SimulatorFactory, start_gateway: GatewayFactory
) -> None:
    replica = start_simulator(MODEL, "--time-scale", "0.01")
    policy = PolicyBuilder().model(MODEL, [replica.base_url])
    policy.service_account(AUTOMATION_CLIENT, like=policy.key())
    policy.publish(valkey_client)
    gateway = start_gateway()  # no SWITCHYARD_OIDC_ISSUER

    response = chat(gateway, realm.client_credentials_token())
    assert refusal(response) == (401, "invalid_api_key", "Incorrect API key provided.")
