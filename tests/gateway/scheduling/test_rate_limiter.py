"""Rate limits through the Python API: which limits apply; counted by Scheduler.acquire and
reconciled by Scheduler.release, in the same atomic calls as the queue."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import orjson
import pytest
import valkey.asyncio as avalkey

from gateway.admission import (
    DAY_MS,
    MINUTE_MS,
    Limit,
    estimate_tokens,
    estimated_tokens,
    limits_for,
    reconcile_args,
)
from gateway.autopipeline import pack_values
from gateway.policy import Limits, Policy, Principal, parse_snapshot
from gateway.scheduling import (
    RateLimited,
    Scheduler,
    Ticket,
    TicketPlans,
    fleet_entry,
    keys,
    ticket_for,
    write_fleet,
)

from .conftest import MODEL, R1

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
                "replicas": ["http://a:8000", "http://b:8000", "http://d:8000"],
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


def test_a_ticket_plan_makes_the_ticket_that_ticket_for_and_limits_for_make():
    """GIVEN a snapshot with request and token limits at every level
    WHEN the gateway makes a request's ticket from the plan it cached for (alice, llama)
    THEN it is the ticket ticket_for and limits_for make, whatever the token estimate;
    the plan is reused until a new snapshot arrives, which gets its own."""
    policy = snapshot(**POLICY_SECTIONS)
    llama = policy.models["llama"]
    plans = TicketPlans()

    for estimate in (0, 1, 1_500, 28_000):
        planned = plans.plan(policy, ALICE, llama).ticket(
            request_id="r1", cost=estimate, prefix_hash="p"
        )
        limits = limits_for(policy, ALICE, "llama", estimate)
        assert planned == ticket_for(
            policy, ALICE, llama, request_id="r1", cost=estimate, prefix_hash="p", limits=limits
        )
    assert plans.plan(policy, ALICE, llama) is plans.plan(policy, ALICE, llama)
    assert (
        plans.plan(policy, ALICE, policy.models["qwen"]).ticket(request_id="r2", cost=10).model
        == "qwen"
    )

    newer = snapshot(**{**POLICY_SECTIONS, "rate_limits": []})
    from_newer = plans.plan(newer, ALICE, newer.models["llama"])
    assert from_newer is not plans.plan(policy, ALICE, llama)
    assert [limit.name for limit in from_newer.ticket(request_id="r3", cost=5).limits] == [
        "use case chatbot requests per minute",
        "use case chatbot tokens per day",
    ]


def test_acquire_from_a_plan_is_packed_exactly_as_from_every_argument():
    """GIVEN tickets made by plans: limits of both kinds interleaved (llama), fewer (qwen),
    none (a snapshot without limits)
    WHEN the scheduler packs acquire's call from the plan's values, packed once
    THEN the bytes are those of packing every argument afresh, whatever the estimate; and a
    ticket that dropped its limits and plan (failover) is packed afresh."""
    client = avalkey.Valkey(host="127.0.0.1", port=1)
    scheduler = Scheduler(client, gateway_id="gw-a")
    with_lanes = Scheduler(client, gateway_id="gw-b", long_prompt_tokens=8192)
    plans = TicketPlans()

    # Split slots (a Cluster): acquire names the pool's slot alone (its limits are the
    # pool's; a ticket without limits keeps its plan and takes the packed way).
    split = Scheduler(client, gateway_id="gw-c", split_slots=True)

    def packed_both_ways(ticket: Ticket, scheduler: Scheduler = scheduler) -> None:
        args = scheduler.acquire_args(ticket, "lease-1", NOW)
        slots = [keys.pool_prefix(ticket.model)]
        if not scheduler.split_slots:
            slots.append(keys.account_prefix(ticket.tenant))
        expected = (pack_values([len(slots), *slots, *args]), 1 + len(slots) + len(args))
        assert scheduler._acquire_call(ticket, "lease-1", NOW) == expected

    used = []
    for policy in (snapshot(**POLICY_SECTIONS), snapshot()):
        for model in policy.models.values():
            plan = plans.plan(policy, ALICE, model)
            used.append(plan)
            for estimate in (0, 7, 28_000):
                made = plan.ticket(
                    request_id=f"r{estimate}",
                    cost=estimate,
                    prefix_hash="abc",
                    prompt_tokens=estimate,
                )
                packed_both_ways(made)
                packed_both_ways(made)  # the second time from the packed plan
                if not made.limits:
                    packed_both_ways(made, split)
    # The long flag and the pool's lanes (3 replicas: llama; 1: qwen), packed both ways too.
    lanes = TicketPlans()
    for model in snapshot(**POLICY_SECTIONS).models.values():
        plan = lanes.plan(snapshot(), ALICE, model)
        for prompt in (0, 8_191, 8_192, 28_000):
            made = plan.ticket(request_id="r", cost=prompt + 100, prompt_tokens=prompt)
            packed_both_ways(made, with_lanes)
            packed_both_ways(made, with_lanes)
            args = with_lanes.acquire_args(made, "lease-1", NOW)
            assert (args[12], args[18]) == (
                (1 if prompt >= 8_192 and len(model.replicas) >= 3 else 0),
                (1 if len(model.replicas) >= 3 else 0),
            )
    assert all(plan.packed is not None for plan in used)  # every plan took the packed way
    limited = snapshot(**POLICY_SECTIONS)
    failed_over = plans.plan(limited, ALICE, limited.models["llama"]).ticket(
        request_id="r", cost=50
    )
    assert failed_over.limits
    packed_both_ways(replace(failed_over, limits=(), plan=None))


def test_estimate_tokens_caps_the_completion_by_the_model():
    assert estimate_tokens(prompt_chars=400, max_tokens=100, model_max_tokens=4096) == 200
    assert estimate_tokens(prompt_chars=400, max_tokens=10**6, model_max_tokens=4096) == 4196
    assert estimate_tokens(prompt_chars=0, max_tokens=None, model_max_tokens=2048) == 2048
    assert estimate_tokens(prompt_chars=3, max_tokens=None, model_max_tokens=None) == 513


def _limit(limit_id: str, kind: str, limit: int, cost: int) -> Limit:
    return Limit(limit_id, kind, MINUTE_MS, limit, cost, f"the {limit_id} limit")  # type: ignore[arg-type]


def _ticket(request_id: str, *limits: Limit) -> Ticket:
    return Ticket(
        request_id=request_id,
        model=MODEL,
        replicas=((R1, 1_000),),
        rank=0,
        priority_class="prod",
        queue_timeout_s=5.0,
        max_queue_length=100,
        tenant="acme",
        use_case_id=12,
        cost=max(estimated_tokens(limits), 1),
        limits=limits,
    )


@asynccontextmanager
async def scheduler_at(url: str, clock: list[int]) -> AsyncIterator[Scheduler]:
    """A started scheduler whose clock reads ``clock[0]``, with a replica fresh at NOW."""
    client = avalkey.Valkey.from_url(url)
    scheduler = Scheduler(client, clock=lambda: clock[0], stale_ms=60_000)
    entry = fleet_entry(waiting=0, running=0, kv_usage=0.0, scraped_at_ms=NOW)
    await write_fleet(client, MODEL, {R1: entry})
    await scheduler.start()
    try:
        yield scheduler
    finally:
        await scheduler.close()
        await client.aclose()


async def test_acquire_counts_all_limits_or_none_and_names_the_refusing_one(
    valkey_client, valkey_url
):
    clock = [NOW]
    roomy = _limit("roomy", "tok", 1_000_000, 5_000)
    tight = _limit("tight", "req", 2, 1)
    async with scheduler_at(valkey_url, clock) as scheduler:
        await scheduler.acquire(_ticket("a", roomy, tight))
        await scheduler.acquire(_ticket("b", roomy, tight))
        window = keys.rate_window(keys.rate_limit("roomy"), NOW // MINUTE_MS)
        assert valkey_client.get(window) == b"10000"
        clock[0] = NOW + 1

        with pytest.raises(RateLimited) as refused:
            await scheduler.acquire(_ticket("c", roomy, tight))

        assert refused.value.limit == tight
        # The rest of this minute (49.999 s), then until 2 * (1 - e/W) + 1 <= 2 (30 s).
        assert (refused.value.retry_after_ms, refused.value.retry_after_s) == (79_999, 80)
        assert not refused.value.never_fits
        assert refused.value.status == 429
        assert refused.value.code == "rate_limit_exceeded"
        assert "the tight limit" in refused.value.message
        assert valkey_client.get(window) == b"10000"  # the roomy limit was not charged either
        assert valkey_client.hget(keys.in_flight(MODEL), R1) == b"2"  # nor a slot taken


async def test_a_request_without_limits_is_only_scheduled(valkey_client, valkey_url):
    async with scheduler_at(valkey_url, [NOW]) as scheduler:
        await scheduler.release(await scheduler.acquire(_ticket("a")))
    assert valkey_client.keys(keys.KEY_PREFIX + "rl:*") == []


async def test_release_refunds_what_the_request_did_not_use(valkey_client, valkey_url):
    """GIVEN a 10k tokens/min limit and a request estimated at 8k, WHEN it used only 1k,
    THEN its release refunds 7k and a second 8k request fits in the same minute."""
    clock = [NOW]
    tokens = (_limit("tpm", "tok", 10_000, 8_000), _limit("rpm", "req", 100, 1))
    async with scheduler_at(valkey_url, clock) as scheduler:
        first = await scheduler.acquire(_ticket("a", *tokens))
        assert first.admitted_ms == NOW
        clock[0] = NOW + 1
        with pytest.raises(RateLimited):
            await scheduler.acquire(_ticket("b", *tokens))

        clock[0] = NOW + 2
        corrections = reconcile_args(tokens, admitted_ms=first.admitted_ms, actual_tokens=1_000)
        assert corrections == [keys.rate_limit("tpm"), MINUTE_MS, NOW // MINUTE_MS, -7_000]
        await scheduler.release(first, corrections)

        assert (
            valkey_client.get(keys.rate_window(keys.rate_limit("tpm"), NOW // MINUTE_MS)) == b"1000"
        )
        assert valkey_client.get(keys.rate_window(keys.rate_limit("rpm"), NOW // MINUTE_MS)) == b"1"
        clock[0] = NOW + 3
        await scheduler.acquire(_ticket("c", *tokens))


def test_an_exact_estimate_needs_no_correction():
    tokens = (_limit("tpm", "tok", 10_000, 800), _limit("rpm", "req", 100, 1))
    assert reconcile_args(tokens, admitted_ms=NOW, actual_tokens=800) == []


async def test_a_request_over_the_limit_itself_never_fits(valkey_client, valkey_url):
    async with scheduler_at(valkey_url, [NOW]) as scheduler:
        with pytest.raises(RateLimited) as refused:
            await scheduler.acquire(_ticket("a", _limit("tpm", "tok", 100, 101)))
    assert refused.value.never_fits
    assert "larger than the limit" in refused.value.message
