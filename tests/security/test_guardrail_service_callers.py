"""The guardrail service answers only its callers, and only within its text budget (issue 24,
defect 8): a client could otherwise keep killing guardrail workers with checks that run past
the timeout, and any pod could ask it for checks.

GIVEN the real service (``python -m guardrails.service``) with a token and a small budget
WHEN a caller comes without the token, with a wrong one, or with texts over the budget
THEN it is refused (401, 413) before any worker runs, and no worker is killed or replaced;
and a gateway presents the token and refuses a request over the budget itself (400), before
anything is sent to the service.
"""

from __future__ import annotations

import os
import subprocess

import httpx

from ops.processes import PYTHON, REPO_ROOT
from testkit.guardrail_service import GuardrailServiceFactory, start_guardrail_service
from testkit.module_stack import module_stack
from testkit.policy import PolicyBuilder

__all__ = ["start_guardrail_service"]  # the fixture, for this module

TOKEN = "test-guardrail-token-0123456789"
WORDS = {"guardrail": "words", "action": "redact", "settings": {"words": ["secret"]}}


def _check(url: str, texts: list[str], token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    body = {"stage": "request", "texts": texts, "checks": [WORDS]}
    return httpx.post(url + "/v1/check", json=body, headers=headers, timeout=30)


def _replaced(url: str) -> float:
    lines = httpx.get(url + "/metrics").text.splitlines()
    prefix = "switchyard_guardrail_service_workers_replaced_total"
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))


def test_checks_need_the_token_and_the_probes_do_not(
    start_guardrail_service: GuardrailServiceFactory,
) -> None:
    service = start_guardrail_service(SWITCHYARD_GUARDRAIL_TOKEN=TOKEN)
    for token in (None, "wrong", TOKEN + "x", TOKEN.upper()):
        refused = _check(service.url, ["a secret"], token)
        assert refused.status_code == 401, (token, refused.text)
        assert refused.json()["error"]["code"] == "unauthorised"
    answered = _check(service.url, ["a secret"], TOKEN)
    assert answered.status_code == 200, answered.text
    assert answered.json()["texts"] == ["a <WORD>"]
    assert httpx.get(service.url + "/healthz").status_code == 200
    assert httpx.get(service.url + "/metrics").status_code == 200


def test_texts_over_the_budget_are_refused_before_a_worker_sees_them(
    start_guardrail_service: GuardrailServiceFactory,
) -> None:
    service = start_guardrail_service(
        SWITCHYARD_GUARDRAIL_TOKEN=TOKEN, SWITCHYARD_GUARDRAIL_MAX_TEXT_CHARS="1000"
    )
    # The budget is over all the texts of one check together, not each.
    for texts in (["x" * 1001], ["x" * 600, "y" * 401], ["z" * 10] * 101):
        refused = _check(service.url, texts, TOKEN)
        assert refused.status_code == 413, refused.text
        error = refused.json()["error"]
        assert error["code"] == "guardrail_text_too_large"
        assert "1,000 characters" in error["message"]
    within = _check(service.url, ["x" * 600, "a secret" + "y" * 392], TOKEN)
    assert within.status_code == 200, within.text
    assert _replaced(service.url) == 0


def test_bulk_checks_need_the_token_and_keep_the_budget_of_each_body(
    start_guardrail_service: GuardrailServiceFactory,
) -> None:
    """The bulk endpoint (an async bulk submit's bodies, one call) is no way around either:
    401 without the token, 413 when any one body is over the budget, though all of them
    together may be over it (the budget is a body's, as for its own /v1/check)."""
    service = start_guardrail_service(
        SWITCHYARD_GUARDRAIL_TOKEN=TOKEN, SWITCHYARD_GUARDRAIL_MAX_TEXT_CHARS="1000"
    )

    def bulk(bodies: list[list[str]], token: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        body = {"stage": "request", "bodies": bodies, "checks": [WORDS]}
        return httpx.post(url + "/v1/check/bulk", json=body, headers=headers, timeout=30)

    url = service.url
    for token in (None, "wrong"):
        assert bulk([["a secret"]], token).status_code == 401
    over = bulk([["x" * 10], ["x" * 600, "y" * 401]], TOKEN)
    assert over.status_code == 413, over.text
    assert over.json()["error"]["code"] == "guardrail_text_too_large"
    within = bulk([["x" * 900], ["a secret " + "y" * 900]], TOKEN)  # 1,809 together
    assert within.status_code == 200, within.text
    assert within.json()["results"][1]["texts"] == ["a <WORD> " + "y" * 900]
    assert _replaced(service.url) == 0


def test_the_service_will_not_listen_beyond_loopback_without_a_token() -> None:
    env = {
        **os.environ,
        "SWITCHYARD_GUARDRAIL_HOST": "0.0.0.0",
        "SWITCHYARD_GUARDRAIL_PORT": "1",  # never reached: it must refuse before binding
        "SWITCHYARD_GUARDRAIL_TOKEN": "",
    }
    ended = subprocess.run(
        [PYTHON, "-m", "guardrails.service"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ended.returncode != 0
    assert "SWITCHYARD_GUARDRAIL_TOKEN" in ended.stderr


def _answered(service_url: str) -> float:
    lines = httpx.get(service_url + "/metrics").text.splitlines()
    prefix = "switchyard_guardrail_service_checks_total{"
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))


def test_a_gateway_presents_the_token_and_refuses_text_over_the_budget_itself() -> None:
    budget = {"SWITCHYARD_GUARDRAIL_MAX_TEXT_CHARS": "1000"}
    with module_stack(
        guardrail_service=True, guardrail_env={"SWITCHYARD_GUARDRAIL_TOKEN": TOKEN, **budget}
    ) as stack:
        model = "llama-budget"
        replica = stack.simulator(model, "--time-scale", "0")
        policy = PolicyBuilder()
        policy.model(model, [replica], capabilities=("chat", "completions"))
        key = policy.key(use_case="guarded")
        policy.guardrail(key, "words", side="request", action="block", config={"words": ["secret"]})
        gateway = stack.gateway(policy, SWITCHYARD_GUARDRAIL_TOKEN=TOKEN, **budget)
        tokenless = stack.gateway(policy, **budget)

        def chat(base_url: str, *contents: str) -> httpx.Response:
            messages = [{"role": "user", "content": content} for content in contents]
            return httpx.post(
                base_url + "/v1/chat/completions",
                json={"model": model, "messages": messages, "max_tokens": 4},
                headers={"authorization": f"Bearer {key}"},
                timeout=30,
            )

        assert chat(gateway, "hello").status_code == 200  # checked, with the token
        blocked = chat(gateway, "a secret")
        assert blocked.status_code == 400
        assert blocked.json()["error"]["code"] == "guardrail_blocked"

        answered = _answered(stack.guardrail_url)
        for contents in (["x" * 1001], ["x" * 600, "y" * 401]):
            over = chat(gateway, *contents)
            assert over.status_code == 400, over.text
            assert over.json()["error"]["code"] == "guardrail_text_too_large"
        assert _answered(stack.guardrail_url) == answered  # nothing was sent
        assert chat(gateway, "x" * 600, "y" * 400).status_code == 200  # all of the budget

        # A gateway without the token cannot have its checks run: the use case fails closed.
        refused = chat(tokenless, "hello")
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "guardrail_unavailable"
