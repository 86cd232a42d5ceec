"""A developer's "My usage" page: the limits in force and what is left of each window now.

The windows are counted by the gateway's own scheduler (acquire.lua and limits.lua against the
session's real Valkey), from the policy snapshot governance publishes; the page must say
exactly what peek.lua would admit. Personas: alice is a developer of tenant acme, bob a
developer of tenant globex, audrey an auditor, mallory has an account and no role.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
import valkey
import valkey.asyncio as avalkey
from django.test import Client

from gateway.admission import MINUTE_MS, limits_for
from gateway.policy import Policy, Principal
from gateway.scheduling import (
    RateLimited,
    Scheduler,
    fleet_entry,
    ticket_for,
    wall_ms,
    write_fleet,
)
from governance.choices import RateLimitScope, UseCaseStatus
from governance.models import Model, RateLimitPolicy, UseCase
from governance.roles import Role
from governance.snapshot import snapshot_publish
from ops.processes import free_port
from portal.charts.budget import published_policy, use_case_budgets
from records.models import AdmissionDecision
from testkit.factories import make_key, make_model, make_tenant, make_use_case, make_user

pytestmark = pytest.mark.django_db

REPLICA = "http://127.0.0.1:9"
NOW = 1_000 * MINUTE_MS + 10_000  # 10 s into a minute window


@dataclass
class World:
    chatbot: UseCase
    drafts: UseCase
    search: UseCase
    llama: Model
    alice: Client
    bob: Client
    audrey: Client
    mallory: Client


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def world(settings, valkey_url: str, valkey_client: valkey.Valkey) -> World:
    settings.VALKEY_URL = valkey_url
    acme, globex = make_tenant("acme"), make_tenant("globex")
    llama = make_model("llama", replicas=[REPLICA])
    chatbot = make_use_case(
        acme,
        "chatbot",
        models=(llama,),
        requests_per_minute=5,
        tokens_per_minute=1_000,
        tokens_per_day=50_000,
        max_concurrent=3,
    )
    drafts = make_use_case(acme, "drafts", models=(llama,), status=UseCaseStatus.DRAFT)
    search = make_use_case(globex, "search", models=(llama,), requests_per_minute=9)
    RateLimitPolicy.objects.create(
        name="acme-tokens", scope=RateLimitScope.TENANT, tenant=acme, tokens_per_minute=2_000
    )
    make_key(chatbot)
    make_key(search)
    snapshot_publish(client=valkey_client)
    return World(
        chatbot=chatbot,
        drafts=drafts,
        search=search,
        llama=llama,
        alice=_client_for(make_user("alice", Role.DEVELOPER, tenants=(acme,))),
        bob=_client_for(make_user("bob", Role.DEVELOPER, tenants=(globex,))),
        audrey=_client_for(make_user("audrey", Role.AUDITOR)),
        mallory=_client_for(make_user("mallory")),
    )


def _principal(policy: Policy, use_case: UseCase) -> Principal:
    return next(p for p in policy.principals.values() if p.use_case_id == use_case.pk)


class Gateway:
    """The gateway's scheduler over the published policy, at a clock the test sets."""

    def __init__(self, url: str, policy: Policy, principal: Principal, clock: list[int]) -> None:
        self.client = avalkey.Valkey.from_url(url)
        self.scheduler = Scheduler(self.client, clock=lambda: clock[0], stale_ms=10**12)
        self.policy, self.principal, self.clock = policy, principal, clock

    def ticket(self, request_id: str, tokens: int):
        model = self.policy.models["llama"]
        limits = limits_for(self.policy, self.principal, "llama", tokens)
        return ticket_for(
            self.policy, self.principal, model, request_id=request_id, cost=tokens, limits=limits
        )

    async def __aenter__(self) -> Gateway:
        entry = fleet_entry(waiting=0, running=0, kv_usage=0.0, scraped_at_ms=self.clock[0])
        await write_fleet(self.client, "llama", {REPLICA: entry})
        await self.scheduler.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.scheduler.close()
        await self.client.aclose()


def _by_id(budget) -> dict[str, tuple[int, int, int]]:
    return {w.limit_id: (w.limit, w.used, w.remaining) for w in budget.windows}


def test_remaining_is_the_largest_cost_the_gateway_would_admit_now(
    world: World, valkey_url: str, valkey_client: valkey.Valkey
) -> None:
    policy = published_policy(valkey_client)
    assert policy is not None
    principal = _principal(policy, world.chatbot)
    uc = world.chatbot.pk
    clock = [NOW]
    refused: list[RateLimited] = []

    async def story() -> None:
        async with Gateway(valkey_url, policy, principal, clock) as gw:
            held = await gw.scheduler.acquire(gw.ticket("r1", 300))
            done = await gw.scheduler.acquire(gw.ticket("r2", 120))
            await gw.scheduler.release(done)
            assert held.lease_id
            # A minute later, 15 s into the next window: the 420 tokens fade to 315.
            clock[0] = NOW + 65_000
            await gw.scheduler.check_limits(gw.ticket("fits", 685))
            try:
                await gw.scheduler.check_limits(gw.ticket("one-too-many", 686))
            except RateLimited as exc:
                refused.append(exc)

    asyncio.run(asyncio.wait_for(story(), 20))

    now = use_case_budgets([world.chatbot], client=valkey_client, now_ms=NOW + 30_000)
    budget = now.by_use_case[uc]
    assert now.available
    assert budget.in_policy
    assert _by_id(budget) == {
        "p:acme-tokens:tpm": (2_000, 420, 1_580),
        f"uc:{uc}:rpm": (5, 2, 3),
        f"uc:{uc}:tpm": (1_000, 420, 580),
        f"uc:{uc}:tpd": (50_000, 420, 49_580),
    }
    assert (budget.max_concurrent, budget.in_flight) == (3, 1)  # r1 is still held

    later = use_case_budgets([world.chatbot], client=valkey_client, now_ms=NOW + 65_000)
    assert _by_id(later.by_use_case[uc])[f"uc:{uc}:tpm"] == (1_000, 315, 685)
    # peek.lua agrees to the token: 685 passed above, 686 was refused on that very limit.
    assert [exc.limit.id for exc in refused] == [f"uc:{uc}:tpm"]


def _wait_clear_of_a_minute_boundary() -> None:
    """The page reads Valkey's clock; keep the count and the read in one minute window."""
    into = wall_ms() % MINUTE_MS
    if into > 50_000:
        time.sleep((MINUTE_MS - into) / 1000 + 0.2)


def test_alice_sees_her_windows_refusals_and_links_on_my_usage(
    world: World, valkey_url: str, valkey_client: valkey.Valkey
) -> None:
    policy = published_policy(valkey_client)
    assert policy is not None
    principal = _principal(policy, world.chatbot)
    uc = world.chatbot.pk
    AdmissionDecision.objects.create(
        stream_id="1-0",
        request_id="req-over",
        occurred_at=datetime(2026, 3, 10, 14, 2, 15, tzinfo=UTC),
        decision="rejected",
        reason="rate_limit:use case chatbot tokens per minute",
        tenant="acme",
        tenant_id=world.chatbot.tenant_id,
        use_case_id=uc,
        model="llama",
        retry_after_s=42,
    )
    _wait_clear_of_a_minute_boundary()
    clock = [wall_ms()]

    async def two_requests() -> None:
        async with Gateway(valkey_url, policy, principal, clock) as gw:
            for request_id, tokens in (("a", 300), ("b", 120)):
                await gw.scheduler.release(
                    await gw.scheduler.acquire(gw.ticket(request_id, tokens))
                )

    asyncio.run(asyncio.wait_for(two_requests(), 20))
    response = world.alice.get("/my-usage/")
    html = response.content.decode()

    assert response.status_code == 200
    assert [e["use_case"].slug for e in response.context["entries"]] == ["chatbot", "drafts"]
    assert f'<td class="num" data-limit-id="uc:{uc}:rpm">3</td>' in html
    assert f'<td class="num" data-limit-id="uc:{uc}:tpm">580</td>' in html
    assert '<td class="num" data-limit-id="p:acme-tokens:tpm">1580</td>' in html
    assert "Concurrent requests: 0 in flight of at most 3." in html
    assert "<code>req-over</code>" in html
    assert "<td>rate limit: use case chatbot tokens per minute</td>" in html
    assert "<td>42 s</td>" in html  # the Retry-After the gateway answered
    assert f'href="/use-cases/{uc}/usage/"' in html
    assert f'href="/files/?use_case={uc}"' in html
    # The draft is not in the gateway's policy: no limits in force, said so.
    assert "the gateway's policy does not hold this use case" in html
    assert "globex" not in html


def test_bob_sees_only_his_tenants_use_cases(world: World) -> None:
    response = world.bob.get("/my-usage/")

    assert [e["use_case"].slug for e in response.context["entries"]] == ["search"]
    assert "chatbot" not in response.content.decode()


def test_my_usage_is_for_developers_only(world: World) -> None:
    assert world.audrey.get("/my-usage/").status_code == 404
    assert world.mallory.get("/my-usage/").status_code == 404
    assert Client().get("/my-usage/").status_code == 302


def test_an_unreachable_valkey_is_said_not_hidden(world: World, settings) -> None:
    settings.VALKEY_URL = f"valkey://127.0.0.1:{free_port()}/0"

    response = world.alice.get("/my-usage/")

    assert response.status_code == 200
    assert "The live windows cannot be read now" in response.content.decode()
    assert "data-limit-id" not in response.content.decode()


def test_my_usage_pages_ten_use_cases_at_a_time(world: World) -> None:
    acme = world.chatbot.tenant
    for n in range(10):
        make_use_case(acme, f"extra-{n:02d}", status=UseCaseStatus.DRAFT)

    first = world.alice.get("/my-usage/")
    second = world.alice.get("/my-usage/?page=2")

    assert len(first.context["entries"]) == 10
    assert [e["use_case"].slug for e in second.context["entries"]] == [
        "extra-08",
        "extra-09",
    ]  # after chatbot, drafts, extra-00…07
    assert 'href="?page=2" rel="next"' in first.content.decode()


def test_a_model_limit_is_shown_on_the_models_it_applies_to(
    world: World, valkey_client: valkey.Valkey
) -> None:
    qwen = make_model("qwen", replicas=["http://127.0.0.1:8"])
    world.chatbot.allowed_models.add(qwen)
    RateLimitPolicy.objects.create(
        name="llama-rpm", scope=RateLimitScope.MODEL, model=world.llama, requests_per_minute=100
    )
    snapshot_publish(client=valkey_client)

    budget = use_case_budgets([world.chatbot], client=valkey_client, now_ms=NOW)
    applies = {w.limit_id: w.models for w in budget.by_use_case[world.chatbot.pk].windows}

    assert applies["p:llama-rpm:rpm"] == ("llama",)
    assert applies[f"uc:{world.chatbot.pk}:rpm"] == ()  # every allowed model
