"""A use case's remaining budget per rate-limit window, read the way the gateway counts it.

The limits come from the policy snapshot the gateway enforces (published to Valkey by
governance/snapshot.py), expanded by the gateway's own ``limits_for``; the counters are the
sliding windows limits.lua keeps (``<slot>rl:<limit-id>:<window-index>``, the slot chosen as
gateway/slots.py says), judged with the same formula at Valkey's clock. Nothing is written:
this is a read of two keys a window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import valkey

from gateway.admission import Limit, limits_for
from gateway.policy import SNAPSHOT_KEY, Policy, Principal, parse_snapshot
from gateway.scheduling import keys
from governance.models import UseCase
from runtime.valkey_urls import VALKEY_FAILURES

_FAILED_OR_INVALID: tuple[type[BaseException], ...] = (*VALKEY_FAILURES, ValueError)

# limits.lua's epsilon: a request fits when estimate + cost <= limit + 1e-9.
EPSILON = 1e-9
WINDOW_WORDS = {60_000: "minute", 86_400_000: "day"}


@dataclass(frozen=True)
class WindowBudget:
    limit_id: str
    name: str
    kind: str  # "req" | "tok"
    window: str
    limit: int
    used: int  # the sliding estimate, rounded
    remaining: int  # the largest cost that would be admitted now
    models: tuple[str, ...]  # the models it applies to ((): every model of the use case)

    @property
    def unit(self) -> str:
        return "requests" if self.kind == "req" else "tokens"

    @property
    def percent_left(self) -> int:
        return math.floor(100 * self.remaining / self.limit) if self.limit else 0


@dataclass(frozen=True)
class UseCaseBudget:
    use_case: UseCase
    in_policy: bool  # whether the published policy holds the use case (approved, published)
    windows: list[WindowBudget] = field(default_factory=list)
    max_concurrent: int | None = None
    in_flight: int = 0


@dataclass(frozen=True)
class Budgets:
    available: bool  # False: Valkey could not be read (or holds no published policy)
    by_use_case: dict[int, UseCaseBudget]


def published_policy(client: valkey.Valkey) -> Policy | None:
    raw = client.get(SNAPSHOT_KEY)
    if not isinstance(raw, bytes):
        return None
    return parse_snapshot(raw)


def window_remaining(limit: Limit, current: int, previous: int, now_ms: int) -> tuple[float, int]:
    """limits.lua's estimate at ``now_ms`` and the largest cost it would admit now."""
    index = now_ms // limit.window_ms
    elapsed = now_ms - index * limit.window_ms
    estimate = previous * (1 - elapsed / limit.window_ms) + current
    return estimate, max(0, math.floor(limit.limit - estimate + EPSILON))


def _applicable(policy: Policy, use_case: UseCase) -> list[tuple[Limit, tuple[str, ...]]]:
    principal = Principal(
        key_id=None,
        key_prefix="",
        tenant=use_case.tenant.slug,
        tenant_id=use_case.tenant_id,
        environment=use_case.tenant.environment,
        use_case=use_case.slug,
        use_case_id=use_case.pk,
        namespace=use_case.namespace,
        models=frozenset(),
        expires_at=None,
    )
    models = sorted(m.public_id for m in use_case.allowed_models.all()) or [""]
    found: dict[str, tuple[Limit, list[str]]] = {}
    for model in models:
        for limit in limits_for(policy, principal, model, 0):
            found.setdefault(limit.id, (limit, []))[1].append(model)
    return [(limit, () if len(on) == len(models) else tuple(on)) for limit, on in found.values()]


def use_case_budgets(
    use_cases: Sequence[UseCase], *, client: valkey.Valkey, now_ms: int | None = None
) -> Budgets:
    """Every window of each use case now; ``now_ms`` defaults to Valkey's clock (the one the
    gateway's scripts compare)."""
    try:
        policy = published_policy(client)
        if now_ms is None:
            seconds, micros = cast(tuple[int, int], client.time())
            now_ms = int(seconds) * 1000 + int(micros) // 1000
    except _FAILED_OR_INVALID:
        return Budgets(available=False, by_use_case={})
    if policy is None:
        return Budgets(available=False, by_use_case={})
    plans = {
        uc.pk: _applicable(policy, uc) if uc.pk in policy.use_cases else [] for uc in use_cases
    }
    names: list[str] = []
    for planned in plans.values():
        for limit, _ in planned:
            index = now_ms // limit.window_ms
            names += [keys.rate_window(limit.stem, index), keys.rate_window(limit.stem, index - 1)]
    try:
        pipe = client.pipeline(transaction=False)
        for name in names:  # one GET each: on a Cluster the windows are in several slots
            pipe.get(name)
        for uc in use_cases:
            pipe.get(keys.concurrency(uc.tenant.slug, uc.pk))
        replies: list[Any] = pipe.execute()  # type: ignore[no-untyped-call]  # untyped in valkey-py
    except VALKEY_FAILURES:
        return Budgets(available=False, by_use_case={})
    counts = [int(v or 0) for v in replies[: len(names)]]
    in_flight = [int(v or 0) for v in replies[len(names) :]]
    result: dict[int, UseCaseBudget] = {}
    at = 0
    for position, uc in enumerate(use_cases):
        windows = []
        for limit, models in plans[uc.pk]:
            estimate, remaining = window_remaining(limit, counts[at], counts[at + 1], now_ms)
            at += 2
            windows.append(
                WindowBudget(
                    limit_id=limit.id,
                    name=limit.name,
                    kind=limit.kind,
                    window=WINDOW_WORDS.get(limit.window_ms, f"{limit.window_ms} ms"),
                    limit=limit.limit,
                    used=round(estimate),
                    remaining=remaining,
                    models=models,
                )
            )
        entry = policy.use_cases.get(uc.pk)
        result[uc.pk] = UseCaseBudget(
            use_case=uc,
            in_policy=entry is not None,
            windows=windows,
            max_concurrent=(entry.limits.max_concurrent or None) if entry else None,
            in_flight=in_flight[position],
        )
    return Budgets(available=True, by_use_case=result)
