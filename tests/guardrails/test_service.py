"""The guardrail service as a real process: checks over HTTP, bad input refused, a stuck
detector killed and replaced, a broken one reported, health and a clean stop."""

from __future__ import annotations

import signal

import httpx
import psutil

from testkit.guardrail_service import GuardrailServiceFactory


def _workers(pid: int) -> list[psutil.Process]:
    """The service's worker processes (not multiprocessing's resource tracker)."""
    return [
        child
        for child in psutil.Process(pid).children()
        if "spawn_main" in " ".join(child.cmdline())
    ]


WORDS = {"guardrail": "words", "action": "redact", "settings": {"words": ["secret"]}}


def _check(url: str, body: object, timeout: float = 30.0) -> httpx.Response:
    return httpx.post(url + "/v1/check", json=body, timeout=timeout)


def test_a_check_runs_the_engine_in_a_worker(start_guardrail_service: GuardrailServiceFactory):
    """GIVEN the service with the word detector WHEN texts are checked with redact
    THEN the words are replaced and the finding counted, the text itself not reported."""
    service = start_guardrail_service()
    response = _check(
        service.url,
        {
            "stage": "request",
            "texts": ["a secret here", "nothing", "Secret again secret"],
            "checks": [WORDS],
        },
    )
    assert response.status_code == 200, response.text
    outcome = response.json()
    assert outcome["texts"] == ["a <WORD> here", "nothing", "<WORD> again <WORD>"]
    assert outcome["findings"] == [
        {"guardrail": "words", "action": "redacted", "entities": {"WORD": 3}, "score": 0.9}
    ]
    assert outcome["blocked"] is None
    assert service.checks_answered() == 1


def test_bad_requests_are_refused_with_the_field_named(
    start_guardrail_service: GuardrailServiceFactory,
):
    service = start_guardrail_service()
    cases = [
        (b"{not json", "not valid JSON"),
        ({"stage": "middle", "texts": [], "checks": [WORDS]}, "'stage'"),
        ({"stage": "request", "texts": "x", "checks": [WORDS]}, "'texts'"),
        ({"stage": "request", "texts": ["x"], "checks": []}, "'checks'"),
        ({"stage": "request", "texts": ["x"], "checks": [{"guardrail": "nope"}]}, "unknown"),
        (
            {"stage": "request", "texts": ["x"], "checks": [{**WORDS, "action": "shout"}]},
            "checks[0].action",
        ),
        (
            {
                "stage": "request",
                "texts": ["x"],
                "checks": [{"guardrail": "slow", "action": "redact"}],
            },
            "checks[0].action",
        ),
        (
            {
                "stage": "request",
                "texts": ["x"],
                "checks": [{"guardrail": "banned_topics", "action": "block"}],
            },
            "runs on the fleet",
        ),
    ]
    for body, expected in cases:
        if isinstance(body, bytes):
            response = httpx.post(service.url + "/v1/check", content=body)
        else:
            response = _check(service.url, body)
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert error["code"] == "invalid_check"
        assert expected in error["message"], (body, error)


def test_a_stuck_detector_is_killed_and_replaced(
    start_guardrail_service: GuardrailServiceFactory,
):
    """GIVEN one worker and a 0.5 s check timeout WHEN a detector sleeps for a minute
    THEN the caller gets 504 guardrail_timeout, the worker process is gone, and a fresh
    worker answers the next check."""
    # The queue timeout is long so the next check waits for the replacement to load, however
    # slow the machine; the 0.5 s check timeout is what is under test.
    service = start_guardrail_service(
        SWITCHYARD_GUARDRAIL_CHECK_TIMEOUT_SECONDS="0.5",
        SWITCHYARD_GUARDRAIL_QUEUE_TIMEOUT_SECONDS="25",
    )
    before = {p.pid for p in _workers(service.process.pid)}
    assert len(before) == 1
    response = _check(
        service.url,
        {
            "stage": "request",
            "texts": ["x"],
            "checks": [{"guardrail": "slow", "action": "block", "settings": {"seconds": 60}}],
        },
    )
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "guardrail_timeout"
    assert not psutil.pid_exists(next(iter(before))) or (
        psutil.Process(next(iter(before))).status() == psutil.STATUS_ZOMBIE
    )
    # The replacement loads, then serves.
    response = _check(service.url, {"stage": "request", "texts": ["secret"], "checks": [WORDS]})
    assert response.status_code == 200, response.text
    assert response.json()["texts"] == ["<WORD>"]
    after = {p.pid for p in _workers(service.process.pid)}
    assert len(after) == 1
    assert after != before
    metrics = httpx.get(service.url + "/metrics").text
    assert 'switchyard_guardrail_service_workers_replaced_total{reason="timeout"} 1.0' in metrics


def test_a_detector_that_raises_fails_the_check_without_leaking_text(
    start_guardrail_service: GuardrailServiceFactory,
):
    service = start_guardrail_service()
    response = _check(
        service.url,
        {
            "stage": "request",
            "texts": ["my password is hunter2"],
            "checks": [{"guardrail": "broken", "action": "flag"}],
        },
    )
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "guardrail_failed"
    assert "RuntimeError" in error["message"]
    assert "hunter2" not in response.text
    # The worker survived its detector's exception.
    ok = _check(service.url, {"stage": "request", "texts": ["secret"], "checks": [WORDS]})
    assert ok.status_code == 200


def test_health_and_a_clean_stop(start_guardrail_service: GuardrailServiceFactory):
    """GIVEN two workers WHEN the service is asked to stop (SIGTERM to it alone)
    THEN it exits 0 and takes its workers with it."""
    service = start_guardrail_service(SWITCHYARD_GUARDRAIL_WORKERS="2")
    health = httpx.get(service.url + "/healthz").json()
    assert health == {"status": "ok", "workers": 2, "size": 2}
    workers = _workers(service.process.pid)
    assert len(workers) == 2
    assert service.process.proc is not None
    service.process.proc.send_signal(signal.SIGTERM)
    assert service.process.proc.wait(15) == 0
    _gone, alive = psutil.wait_procs(workers, timeout=5)
    assert not alive
