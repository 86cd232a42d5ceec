"""Rate limits through the Python API: which limits apply, admit, reconcile."""

from __future__ import annotations

import orjson
import valkey.asyncio as avalkey

from gateway.admission import (
    DAY_MS,
    MINUTE_MS,
    Limit,
    RateLimiter,
    estimate_tokens,
    limits_for,
)
from gateway.policy import Limits, Policy, Principal, parse_snapshot
from gateway.scheduling import keys

NOW = 1_000 * MINUTE_MS + 10_000


def snapshot(**sections: object) -> Policy:
    document = {
        "schema": 1,
        "version": 7,
        "published_at": 0.0,
        "models": {
            "llama": {
                "served_name": "llama-3.1-8b",
                "capabilities": ["chat"],
                "replicas": ["http://a:8000", "http://b:8000"],
                "timeout_s": 30.0,
                "max_tokens": 4096,
                "max_in_flight_per_replica": 8,
            },
            "qwen": {
                "served_name": "qwen",
                "capabilities": ["chat"],
                "replicas": ["http://c:8000"],
                "timeout_s": 300.0,
                "max_tokens": None,
            },
        },
        "keys": {},
        **sections,
    }
    return parse_snapshot(orjson.dumps(document))


def rule(name: str, scope: str, *, model=None, tenant=None, rpm=None, tpm=None, tpd=None):
    return {
        "name": name,
        "scope": scope,
        "model": model,
        "tenant": tenant,
        "requests_per_minute": rpm,
        "tokens_per_minute": tpm,
        "tokens_per_day": tpd,
    }


POLICY_SECTIONS = {
    "use_cases": {
        "12": {
            "tenant": "acme",
            "slug": "chatbot",
            "limits": {
                "requests_per_minute": 60,
                "tokens_per_minute": None,
                "tokens_per_day": 1_000_000,
                "max_concurrent": 4,
            },
            "guardrails": [
                {"guardrail": "pii", "side": "request", "action": "redact", "config": {}}
            ],
        }
    },
    "priority_classes": {
        "prod": {"rank": 1, "vllm_priority": 10, "queue_timeout_s": 20.0, "max_queue_length": 50}
    },
    "rate_limits": [
        rule("everyone", "global", rpm=10_000),
        rule("llama-pool", "model", model="llama", tpm=2_000_000),
        rule("qwen-pool", "model", model="qwen", tpm=1),
        rule("acme-burst", "tenant", tenant="acme", rpm=600, tpm=100_000),
        rule("globex", "tenant", tenant="globex", rpm=1),
        rule("acme-llama", "tenant_model", tenant="acme", model="llama", tpd=5_000_000),
        rule("acme-qwen", "tenant_model", tenant="acme", model="qwen", rpm=1),
    ],
}

ALICE = Principal(
    key_id=1,
    key_prefix="sk-sy-alice",
    tenant="acme",
    tenant_id=1,
    environment="prod",
    use_case="chatbot",
    use_case_id=12,
    namespace="prod",
    models=frozenset({"llama", "qwen"}),
    expires_at=None,
    priority_class="prod",
)


def test_the_snapshot_sections_are_parsed_into_the_policy():
    policy = snapshot(**POLICY_SECTIONS)

    assert policy.models["llama"].max_in_flight_per_replica == 8
    assert policy.models["qwen"].max_in_flight_per_replica == 64  # the default
    assert policy.use_cases[12].limits == Limits(
        requests_per_minute=60, tokens_per_minute=None, tokens_per_day=1_000_000, max_concurrent=4
    )
    assert policy.use_cases[12].guardrails[0].action == "redact"
    assert policy.priority_classes["prod"].vllm_priority == 10
    assert [r.name for r in policy.rate_limits][:2] == ["everyone", "llama-pool"]
    assert policy.rate_limits[3].limits.tokens_per_minute == 100_000


def test_a_snapshot_without_those_sections_still_parses():
    policy = snapshot()
    assert policy.use_cases == {}
    assert policy.priority_classes == {}
    assert policy.rate_limits == ()


def test_limits_for_applies_the_matching_rules_and_the_use_case_in_order():
    limits = limits_for(snapshot(**POLICY_SECTIONS), ALICE, "llama", 1_500)

    described = [(lim.name, lim.kind, lim.window_ms, lim.limit, lim.cost) for lim in limits]
    assert described == [
        ("global requests per minute", "req", MINUTE_MS, 10_000, 1),
        ("model llama tokens per minute", "tok", MINUTE_MS, 2_000_000, 1_500),
        ("tenant acme requests per minute", "req", MINUTE_MS, 600, 1),
        ("tenant acme tokens per minute", "tok", MINUTE_MS, 100_000, 1_500),
        ("tenant acme on model llama tokens per day", "tok", DAY_MS, 5_000_000, 1_500),
        ("use case chatbot requests per minute", "req", MINUTE_MS, 60, 1),
        ("use case chatbot tokens per day", "tok", DAY_MS, 1_000_000, 1_500),
    ]  # fmt: skip
    assert len({limit.id for limit in limits}) == len(limits)


def test_estimate_tokens_caps_the_completion_by_the_model():
    assert estimate_tokens(prompt_chars=400, max_tokens=100, model_max_tokens=4096) == 200
    assert estimate_tokens(prompt_chars=400, max_tokens=10**6, model_max_tokens=4096) == 4196
    assert estimate_tokens(prompt_chars=0, max_tokens=None, model_max_tokens=2048) == 2048
    assert estimate_tokens(prompt_chars=3, max_tokens=None, model_max_tokens=None) == 513


def _limit(limit_id: str, kind: str, limit: int, cost: int) -> Limit:
    return Limit(limit_id, kind, MINUTE_MS, limit, cost, f"the {limit_id} limit")  # type: ignore[arg-type]


async def test_admit_is_all_or_nothing_and_names_the_refusing_limit(valkey_client, valkey_url):
    client = avalkey.Valkey.from_url(valkey_url)
    limiter = RateLimiter(client)
    roomy = _limit("roomy", "tok", 1_000_000, 5_000)
    tight = _limit("tight", "req", 2, 1)
    try:
        assert (await limiter.admit([roomy, tight], now_ms=NOW)).ok
        assert (await limiter.admit([roomy, tight], now_ms=NOW)).ok
        before = await client.get(keys.rate_window("roomy", NOW // MINUTE_MS))

        refused = await limiter.admit([roomy, tight], now_ms=NOW + 1)

        assert not refused.ok
        assert refused.refused == tight
        # The rest of this minute (49.999 s), then until 2 * (1 - e/W) + 1 <= 2 (30 s).
        assert (refused.retry_after_ms, refused.retry_after_s) == (79_999, 80)
        assert not refused.never_fits
        assert await client.get(keys.rate_window("roomy", NOW // MINUTE_MS)) == before == b"10000"
    finally:
        await client.aclose()


async def test_no_limits_admits_without_a_round_trip(valkey_client, valkey_url):
    client = avalkey.Valkey.from_url(valkey_url)
    try:
        assert (await RateLimiter(client).admit([], now_ms=NOW)).ok
        assert await client.dbsize() == 0
    finally:
        await client.aclose()


async def test_reconcile_refunds_what_the_request_did_not_use(valkey_client, valkey_url):
    """GIVEN a 10k tokens/min limit and a request estimated at 8k, WHEN it used only 1k,
    THEN reconcile refunds 7k and a second 8k request fits in the same minute."""
    client = avalkey.Valkey.from_url(valkey_url)
    limiter = RateLimiter(client)
    tokens = [_limit("tpm", "tok", 10_000, 8_000), _limit("rpm", "req", 100, 1)]
    try:
        first = await limiter.admit(tokens, now_ms=NOW)
        assert first.ok
        assert first.estimated_tokens == 8_000
        assert not (await limiter.admit(tokens, now_ms=NOW + 1)).ok

        assert await limiter.reconcile(first, actual_tokens=1_000, now_ms=NOW + 2) == 1

        assert await client.get(keys.rate_window("tpm", NOW // MINUTE_MS)) == b"1000"
        assert await client.get(keys.rate_window("rpm", NOW // MINUTE_MS)) == b"1"
        assert (await limiter.admit(tokens, now_ms=NOW + 3)).ok
    finally:
        await client.aclose()


async def test_a_request_over_the_limit_itself_never_fits(valkey_client, valkey_url):
    client = avalkey.Valkey.from_url(valkey_url)
    try:
        admission = await RateLimiter(client).admit([_limit("tpm", "tok", 100, 101)], now_ms=NOW)
        assert admission.never_fits
    finally:
        await client.aclose()
