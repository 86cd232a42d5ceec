"""Micro-batching in the guardrail service: concurrent checks go to one worker as one job, each
answered exactly as alone; a batch that overruns fails as a whole and its worker is replaced;
window 0 keeps one job per request. A bulk call's bodies are shared out over the workers in a
few jobs, each answered as its own check. And the engine's ``run_many`` under it, in
process."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import httpx
import psutil

from guardrails.base import Finding
from guardrails.engine import Check, Engine, Outcome
from testkit.guardrail_detectors import BrokenDetector, WordDetector
from testkit.guardrail_service import GuardrailServiceFactory

WORDS = {"guardrail": "words", "action": "redact", "settings": {"words": ["secret"]}}
FORBIDDEN = {"guardrail": "words", "action": "block", "settings": {"words": ["forbidden"]}}
SLOW = {"guardrail": "slow", "action": "block", "settings": {"seconds": 60}}
BROKEN = {"guardrail": "broken", "action": "flag"}


def _workers(pid: int) -> set[int]:
    """The service's worker processes (not multiprocessing's resource tracker)."""
    return {
        child.pid
        for child in psutil.Process(pid).children()
        if "spawn_main" in " ".join(child.cmdline())
    }


def _post_together(url: str, bodies: Sequence[object]) -> list[httpx.Response]:
    """Every body posted at once, one thread each, released together."""
    start = threading.Barrier(len(bodies))

    def post(body: object) -> httpx.Response:
        start.wait()
        if isinstance(body, bytes):
            return httpx.post(url + "/v1/check", content=body, timeout=60)
        return httpx.post(url + "/v1/check", json=body, timeout=60)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))


def _batches(url: str) -> tuple[float, float]:
    """(jobs sent to workers, requests in them) from the service's batch-size histogram."""
    count = total = 0.0
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("switchyard_guardrail_service_batch_size_count"):
            count = float(line.rsplit(" ", 1)[1])
        elif line.startswith("switchyard_guardrail_service_batch_size_sum"):
            total = float(line.rsplit(" ", 1)[1])
    return count, total


REQUESTS: list[dict[str, Any]] = [
    {"stage": "request", "texts": ["a secret here", "nothing"], "checks": [WORDS]},
    {"stage": "request", "texts": ["the forbidden plan"], "checks": [FORBIDDEN]},
    {"stage": "request", "texts": ["all clean"], "checks": [WORDS, FORBIDDEN]},
    {
        "stage": "response",
        "texts": ["secret and forbidden", "Secret"],
        "checks": [WORDS, FORBIDDEN],
    },
    {"stage": "request", "texts": ["hunter2"], "checks": [BROKEN]},
]


def test_concurrent_checks_are_batched_and_each_gets_its_own_answer(
    start_guardrail_service: GuardrailServiceFactory,
):
    """GIVEN one worker and a 300 ms batch window WHEN five checks (different texts, checks
    and stages; one blocked, one redacted, one whose detector raises) and a bad one are sent
    at once THEN the bad one is refused on its own, the five go to the worker in fewer jobs
    than requests, and each answer is the one it gets when sent alone."""
    service = start_guardrail_service(SWITCHYARD_GUARDRAIL_BATCH_WINDOW_MS="300")
    bad = {"stage": "request", "texts": "x", "checks": [WORDS]}
    together = _post_together(service.url, [*REQUESTS, bad])

    assert together[-1].status_code == 400
    assert together[-1].json()["error"]["code"] == "invalid_check"
    jobs, requests = _batches(service.url)
    assert requests == len(REQUESTS)  # the bad request joined no batch
    assert jobs < len(REQUESTS)  # at least two shared a job

    redacted, blocked, clean, both, broken = (r.json() for r in together[:5])
    assert redacted == {
        "texts": ["a <WORD> here", "nothing"],
        "findings": [
            {"guardrail": "words", "action": "redacted", "entities": {"WORD": 1}, "score": 0.9}
        ],
        "blocked": None,
    }
    assert blocked["blocked"] == {
        "guardrail": "words",
        "action": "blocked",
        "entities": {"WORD": 1},
        "score": 0.9,
    }
    assert clean == {"texts": ["all clean"], "findings": [], "blocked": None}
    # The redaction came first, then the block, in this request's own order.
    assert both["texts"] == ["<WORD> and forbidden", "<WORD>"]
    assert [f["action"] for f in both["findings"]] == ["redacted", "blocked"]
    assert together[4].status_code == 500
    assert broken["error"]["code"] == "guardrail_failed"
    assert "hunter2" not in together[4].text

    for body, answer in zip(REQUESTS, together, strict=False):
        alone = httpx.post(service.url + "/v1/check", json=body, timeout=60)
        assert (alone.status_code, alone.json()) == (answer.status_code, answer.json()), body


def test_a_batch_that_overruns_fails_as_a_whole_and_its_worker_is_replaced(
    start_guardrail_service: GuardrailServiceFactory,
):
    """GIVEN one worker, a 0.5 s check timeout and a 1 s window WHEN a stuck check and two
    quick ones are sent at once THEN they share one job, all three get 504
    guardrail_timeout, the worker is killed, and a fresh one answers the next check."""
    service = start_guardrail_service(
        SWITCHYARD_GUARDRAIL_CHECK_TIMEOUT_SECONDS="0.5",
        SWITCHYARD_GUARDRAIL_QUEUE_TIMEOUT_SECONDS="25",
        SWITCHYARD_GUARDRAIL_BATCH_WINDOW_MS="1000",
    )
    before = _workers(service.process.pid)
    assert len(before) == 1
    quick = {"stage": "request", "texts": ["secret"], "checks": [WORDS]}
    stuck = {"stage": "request", "texts": ["x"], "checks": [SLOW]}
    answers = _post_together(service.url, [quick, stuck, quick])

    assert [a.status_code for a in answers] == [504, 504, 504], [a.text for a in answers]
    assert {a.json()["error"]["code"] for a in answers} == {"guardrail_timeout"}
    assert "shares its fate" in answers[0].json()["error"]["message"]
    assert _batches(service.url) == (1.0, 3.0)
    old = next(iter(before))
    assert not psutil.pid_exists(old) or psutil.Process(old).status() == psutil.STATUS_ZOMBIE

    ok = httpx.post(service.url + "/v1/check", json=quick, timeout=60)
    assert ok.status_code == 200, ok.text
    assert ok.json()["texts"] == ["<WORD>"]
    after = _workers(service.process.pid)
    assert len(after) == 1
    assert after != before
    metrics = httpx.get(service.url + "/metrics").text
    assert 'switchyard_guardrail_service_workers_replaced_total{reason="timeout"} 1.0' in metrics


def test_window_zero_sends_one_job_per_request(start_guardrail_service: GuardrailServiceFactory):
    """GIVEN batching off (window 0) WHEN four checks are sent at once THEN each is its own
    job, and each answer is right."""
    service = start_guardrail_service(SWITCHYARD_GUARDRAIL_BATCH_WINDOW_MS="0")
    answers = _post_together(service.url, REQUESTS[:4])
    assert [a.status_code for a in answers] == [200, 200, 200, 200]
    assert answers[0].json()["texts"] == ["a <WORD> here", "nothing"]
    assert answers[1].json()["blocked"]["action"] == "blocked"
    assert answers[2].json()["findings"] == []
    assert answers[3].json()["texts"] == ["<WORD> and forbidden", "<WORD>"]
    assert _batches(service.url) == (4.0, 4.0)


# --- bulk calls ---------------------------------------------------------------------------------
def _bulk(url: str, body: object) -> httpx.Response:
    return httpx.post(url + "/v1/check/bulk", json=body, timeout=60)


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_bulk_call_answers_each_body_as_its_own_check_in_a_few_jobs(
    start_guardrail_service: GuardrailServiceFactory,
):
    """GIVEN two workers and batching off WHEN one bulk call carries 30 bodies (some to
    redact, some to block, some clean, one with no text) THEN each body's answer is the one
    its own /v1/check gets, and the 30 went to the workers in a few jobs, not 30."""
    service = start_guardrail_service(SWITCHYARD_GUARDRAIL_WORKERS="2")
    kinds = [["a secret here", "nothing"], ["the forbidden plan"], ["all clean"], []]
    bodies = [kinds[i % len(kinds)] for i in range(30)]
    checks = [WORDS, FORBIDDEN]

    answer = _bulk(service.url, {"stage": "request", "bodies": bodies, "checks": checks})

    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert len(results) == 30
    assert _metric(service.url, "switchyard_guardrail_service_bulk_size_count") == 1
    assert _metric(service.url, "switchyard_guardrail_service_bulk_size_sum") == 30
    jobs, requests = _batches(service.url)
    assert requests == 30
    assert 2 <= jobs < 30
    for texts, result in zip(bodies, results, strict=True):
        alone = httpx.post(
            service.url + "/v1/check",
            json={"stage": "request", "texts": texts, "checks": checks},
            timeout=60,
        )
        assert alone.json() == result, texts
    assert results[0]["texts"] == ["a <WORD> here", "nothing"]
    assert results[1]["blocked"]["guardrail"] == "words"


def test_a_bulk_bodys_failure_is_its_own(start_guardrail_service: GuardrailServiceFactory):
    """GIVEN a detector that raises on every text WHEN a bulk call has two bodies with text
    and one without THEN those two answer guardrail_failed (without their text) and the
    empty one its clean outcome; a bad bulk is refused 400 naming the field, one over the
    text budget 413, before any worker sees them."""
    service = start_guardrail_service(SWITCHYARD_GUARDRAIL_MAX_TEXT_CHARS="100")
    bodies = [["hunter2"], [], ["swordfish"]]

    answer = _bulk(service.url, {"stage": "request", "bodies": bodies, "checks": [BROKEN]})

    assert answer.status_code == 200, answer.text
    failed, empty, also_failed = answer.json()["results"]
    assert failed["error"]["code"] == also_failed["error"]["code"] == "guardrail_failed"
    assert empty == {"texts": [], "findings": [], "blocked": None}
    assert "hunter2" not in answer.text
    assert "swordfish" not in answer.text

    bad = _bulk(service.url, {"stage": "request", "bodies": [["x"], "y"], "checks": [WORDS]})
    assert bad.status_code == 400
    assert "'bodies'" in bad.json()["error"]["message"]
    over = _bulk(
        service.url, {"stage": "request", "bodies": [["x"], ["y" * 101]], "checks": [WORDS]}
    )
    assert over.status_code == 413
    assert over.json()["error"]["code"] == "guardrail_text_too_large"
    assert _metric(service.url, "switchyard_guardrail_service_bulk_size_count") == 1


# --- the engine, in process --------------------------------------------------------------------
class ManyWords(WordDetector):
    """The word detector that can also read many texts in one call, and counts its calls."""

    name: ClassVar[str] = "many_words"

    def __init__(self) -> None:
        self.calls: list[int] = []  # texts per check_many call

    def check_many(self, texts: list[str], settings: Mapping[str, Any]) -> list[list[Finding]]:
        self.calls.append(len(texts))
        return [self.check(text, settings) for text in texts]


class WholePromptWords(WordDetector):
    """Reads the prompt as a whole, as the token limit does."""

    name: ClassVar[str] = "whole_words"
    whole_prompt: ClassVar[bool] = True


def _checks(*specs: tuple[str, str, list[str]]) -> list[Check]:
    return [Check(name, action, {"words": words}) for name, action, words in specs]


def test_run_many_answers_each_request_as_run_alone_and_shares_check_many_calls():
    """GIVEN an engine with a detector that has ``check_many`` (and ones that have not)
    WHEN requests with different texts and checks run as one batch THEN each outcome is
    the one ``run`` gives alone, a raising detector fails only its own request, and the
    requests whose next check is the same detector under the same settings share one call."""
    many = ManyWords()
    engine = Engine(
        [],
        detectors={
            "many_words": many,
            "words": WordDetector(),
            "whole_words": WholePromptWords(),
            "broken": BrokenDetector(),
        },
    )
    secret = ("many_words", "redact", ["secret"])
    jobs: list[tuple[list[str], list[Check]]] = [
        (["a secret", "", "secret again"], _checks(secret, ("words", "block", ["again"]))),
        (["no words"], _checks(secret)),
        (["forbidden secret"], _checks(("words", "flag", ["forbidden"]), secret)),
        (["secret one", "two"], _checks(secret, ("whole_words", "flag", ["one", "two"]))),
        (["secret"], [Check("broken", "flag", {}), *_checks(secret)]),
        (["secret"], _checks(("many_words", "flag", ["other"]), secret)),
    ]
    alone: list[Outcome | str] = []
    for texts, checks in jobs:
        try:
            alone.append(engine.run(texts, checks))
        except RuntimeError as exc:
            alone.append(type(exc).__name__)
    many.calls.clear()

    together = engine.run_many(jobs)

    answers = [type(r).__name__ if isinstance(r, Exception) else r for r in together]
    assert answers == alone
    first = alone[0]
    assert isinstance(first, Outcome)
    assert first.texts == ["a <WORD>", "", "<WORD> again"]
    assert first.blocked is not None
    assert first.blocked.guardrail == "words"
    assert alone[4] == "RuntimeError"
    # Round one: requests 0, 1 and 3 share "secret" (5 non-empty texts), request 5 has other
    # settings; round two: requests 2 and 5 share "secret".
    assert sorted(many.calls) == [1, 2, 5]
