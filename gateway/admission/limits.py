"""Which rate limits apply to a request, from the policy snapshot. Pure: no I/O."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gateway import slots
from gateway.policy import Limits, Policy, Principal

MINUTE_MS = 60_000
DAY_MS = 86_400_000

# When a client sets no max_tokens and the model has no cap, the completion is estimated at
# this many tokens; reconcile corrects the windows once the real count is known.
DEFAULT_COMPLETION_ESTIMATE = 512

LimitKind = Literal["req", "tok"]


@dataclass(frozen=True, slots=True)
class Limit:
    """One sliding-window limit and what this request costs on it.

    ``id`` names the counter in Valkey (stable while the policy row keeps its name);
    ``name`` is for people: it goes into the 429's ``error.message``. ``slot``: the key
    prefix of the slot its counters live in (gateway/slots.py): a model pool's for
    the limits of one model, a tenant's for those that span pools, the shared one (the
    default) for the global limit.
    """

    id: str
    kind: LimitKind
    window_ms: int
    limit: int
    cost: int
    name: str
    slot: str = slots.KEY_PREFIX

    @property
    def stem(self) -> str:
        """Its counters' key without the window index: what limits.lua is given."""
        return slots.rate_limit(self.id, prefix=self.slot)


def estimate_tokens(
    *, prompt_chars: int, max_tokens: int | None, model_max_tokens: int | None
) -> int:
    """A request's token estimate: about four characters a token, plus the completion bound.

    The completion is the client's ``max_tokens`` capped by the model's maximum, or the
    model's maximum, or DEFAULT_COMPLETION_ESTIMATE when neither is known.
    """
    completion = max_tokens if max_tokens is not None else model_max_tokens
    if completion is None:
        completion = DEFAULT_COMPLETION_ESTIMATE
    if model_max_tokens is not None:
        completion = min(completion, model_max_tokens)
    return estimate_prompt_tokens(prompt_chars) + max(completion, 0)


def estimate_prompt_tokens(prompt_chars: int) -> int:
    """A prompt's tokens at about four characters a token (admission's estimate)."""
    return math.ceil(max(prompt_chars, 0) / 4)


def limits_for(
    policy: Policy, principal: Principal, model_id: str, estimated_tokens: int
) -> list[Limit]:
    """Every limit the request must pass: global, model, tenant, tenant × model, use case.

    A limit of ``None`` or 0 is "not set" (as governance validates it). The order is the one
    above, so the most general limit is reported when several would refuse.
    """
    applicable: list[Limit] = []
    pool = slots.pool_prefix(model_id)
    account = slots.account_prefix(principal.tenant)
    for rule in policy.rate_limits:
        if rule.scope == "global":
            who, slot = "global", slots.KEY_PREFIX
        elif rule.scope == "model":
            if rule.model != model_id:
                continue
            who, slot = f"model {model_id}", pool
        elif rule.scope == "tenant":
            if rule.tenant != principal.tenant:
                continue
            who, slot = f"tenant {principal.tenant}", account
        else:
            if rule.tenant != principal.tenant or rule.model != model_id:
                continue
            who, slot = f"tenant {principal.tenant} on model {model_id}", pool
        applicable.extend(_windows(f"p:{rule.name}", who, rule.limits, estimated_tokens, slot))
    use_case = policy.use_cases.get(principal.use_case_id)
    if use_case is not None:
        applicable.extend(
            _windows(
                f"uc:{use_case.id}",
                f"use case {use_case.slug}",
                use_case.limits,
                estimated_tokens,
                account,
            )
        )
    return applicable


# (limits field, id suffix, kind, window, words for people)
_WINDOWS: tuple[tuple[str, str, LimitKind, int, str], ...] = (
    ("requests_per_minute", "rpm", "req", MINUTE_MS, "requests per minute"),
    ("tokens_per_minute", "tpm", "tok", MINUTE_MS, "tokens per minute"),
    ("tokens_per_day", "tpd", "tok", DAY_MS, "tokens per day"),
)


def _windows(base: str, who: str, limits: Limits, tokens: int, slot: str) -> list[Limit]:
    windows: list[Limit] = []
    for field, suffix, kind, window_ms, words in _WINDOWS:
        limit = getattr(limits, field)
        if limit:
            windows.append(
                Limit(
                    id=f"{base}:{suffix}",
                    kind=kind,
                    window_ms=window_ms,
                    limit=limit,
                    cost=1 if kind == "req" else tokens,
                    name=f"{who} {words}",
                    slot=slot,
                )
            )
    return windows


def limit_args(limits: Sequence[Limit]) -> list[str | int]:
    """The limits as acquire.lua takes them: five values each (limits.lua)."""
    args: list[str | int] = []
    for limit in limits:
        args += [limit.stem, limit.kind, limit.window_ms, limit.limit, limit.cost]
    return args


def estimated_tokens(limits: Sequence[Limit]) -> int:
    """What the token windows were charged at admission (0: no token limit applies)."""
    return max((limit.cost for limit in limits if limit.kind == "tok"), default=0)


def reconcile_args(
    limits: Sequence[Limit], *, admitted_ms: int, actual_tokens: int
) -> list[str | int]:
    """For release.lua: add ``actual - estimated`` tokens to each token window the request
    was counted in at ``admitted_ms`` (four values a window; none when the estimate was
    exact or no token limit applies)."""
    args: list[str | int] = []
    for limit in limits:
        delta = actual_tokens - limit.cost
        if limit.kind == "tok" and delta:
            args += [limit.stem, limit.window_ms, admitted_ms // limit.window_ms, delta]
    return args
