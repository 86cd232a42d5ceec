"""Who may call what, and how bad input is refused — always in OpenAI's error shape."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from ops.processes import wait_until
from tests.gateway.conftest import CHAT, EMBED, World


def post(
    world: World, path: str, body: object | None = None, key: str | None = None, **kw
) -> httpx.Response:
    headers = kw.pop("headers", {})
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(world.gateway.base_url + path, json=body, headers=headers, **kw)


def assert_openai_error(response: httpx.Response, status: int, code: str | None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["code"] == code
    return error


CHAT_BODY = {"model": CHAT, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_a_wrong_key_is_refused_with_401_and_never_echoed(world: World) -> None:
    wrong = "sk-sy-" + "x" * 43
    response = post(world, "/v1/chat/completions", CHAT_BODY, key=wrong)
    error = assert_openai_error(response, 401, "invalid_api_key")
    assert wrong not in response.text
    assert wrong[:12] not in error["message"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=world.gateway.base_url + "/v1", api_key=wrong, max_retries=0
        ).models.list()


@pytest.mark.parametrize("authorization", [None, "", "Basic abc", "Bearer", "Token sk-sy-abc"])
def test_a_missing_or_malformed_authorization_header_is_401(world: World, authorization) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = post(world, "/v1/chat/completions", CHAT_BODY, headers=headers)
    assert_openai_error(response, 401, "missing_api_key")


def test_another_tenants_model_is_forbidden_and_an_unknown_model_not_found(world: World) -> None:
    forbidden = post(world, "/v1/embeddings", {"model": EMBED, "input": "x"}, key=world.bob)
    assert_openai_error(forbidden, 403, "model_not_allowed")
    unknown = post(world, "/v1/chat/completions", {**CHAT_BODY, "model": "gpt-9"}, key=world.alice)
    assert_openai_error(unknown, 404, "model_not_found")


def test_a_model_is_only_called_for_what_it_can_do(world: World) -> None:
    response = post(world, "/v1/embeddings", {"model": CHAT, "input": "x"}, key=world.alice)
    assert_openai_error(response, 400, "unsupported_capability")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": CHAT}, "messages"),
        ({"model": CHAT, "messages": []}, "messages"),
        ({"model": CHAT, "messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": 7, "messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({**CHAT_BODY, "stream": "yes"}, "stream"),
        ({**CHAT_BODY, "priority": -100}, "priority"),
    ],
)
def test_invalid_bodies_are_400_with_the_offending_param(world: World, body, param) -> None:
    error = assert_openai_error(
        post(world, "/v1/chat/completions", body, key=world.alice), 400, None
    )
    assert error["param"] == param


def test_bodies_that_are_not_json_objects_are_400(world: World) -> None:
    headers = {"Authorization": f"Bearer {world.alice}", "Content-Type": "application/json"}
    for raw in (b"{not json", b"[1, 2]", b""):
        response = httpx.post(
            world.gateway.base_url + "/v1/chat/completions", content=raw, headers=headers
        )
        assert_openai_error(response, 400, None)


def test_a_body_over_the_limit_is_413(valkey_client, start_simulator, start_gateway) -> None:
    from testkit.policy import PolicyBuilder

    sim = start_simulator(CHAT, "--time-scale", "0")
    policy = PolicyBuilder().model(CHAT, [sim.base_url])
    key = policy.key()
    policy.publish(valkey_client)
    gateway = start_gateway(SWITCHYARD_GATEWAY_MAX_BODY_BYTES="2048")
    big = {**CHAT_BODY, "messages": [{"role": "user", "content": "x" * 4096}]}
    response = httpx.post(
        gateway.base_url + "/v1/chat/completions",
        json=big,
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_unknown_paths_are_404_and_wrong_methods_405(world: World) -> None:
    assert_openai_error(httpx.get(world.gateway.base_url + "/v1/nothing"), 404, "not_found")
    wrong_method = httpx.get(world.gateway.base_url + "/v1/chat/completions")
    assert wrong_method.status_code == 405


def test_vllm_errors_pass_through_with_their_status(world: World) -> None:
    too_long = {**CHAT_BODY, "max_tokens": 10_000_000}
    response = post(world, "/v1/chat/completions", too_long, key=world.alice)
    assert response.status_code == 400
    assert "error" in response.json()


def test_a_revoked_key_stops_working_within_seconds(world: World, valkey_client) -> None:
    assert post(world, "/v1/chat/completions", CHAT_BODY, key=world.bob).status_code == 200
    world.policy.revoke(world.bob)
    world.policy.publish(valkey_client)
    assert wait_until(
        lambda: post(world, "/v1/chat/completions", CHAT_BODY, key=world.bob).status_code == 401,
        timeout=3,
    )
    # alice, untouched by the change, keeps working
    assert post(world, "/v1/chat/completions", CHAT_BODY, key=world.alice).status_code == 200


def test_an_expired_key_is_refused(world: World, valkey_client) -> None:
    soon = world.policy.key(models=[CHAT], expires_at=time.time() + 1.5)
    world.policy.publish(valkey_client)

    def status() -> int:
        return httpx.get(
            world.gateway.base_url + "/v1/models", headers={"Authorization": f"Bearer {soon}"}
        ).status_code

    assert wait_until(lambda: status() == 200, timeout=1.4), "the fresh key never worked"
    # No new snapshot is published: expiry is enforced by the gateway's own clock.
    assert wait_until(lambda: status() == 401, timeout=4)
