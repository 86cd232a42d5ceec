"""What a request asks the scheduler for (Ticket) and what it gets (Grant)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.admission.limits import Limit, limits_for
from gateway.policy import Model, Policy, Principal, PriorityClass
from gateway.scheduling.keys import MAX_RANK

# A principal whose (environment, namespace) cell has no class in the priority matrix waits
# behind every configured class: it gets this name, the next rank after the last one, and
# the model defaults of PriorityClass for the rest.
UNCLASSIFIED = "unclassified"
DEFAULT_QUEUE_TIMEOUT_S = 30.0
DEFAULT_MAX_QUEUE_LENGTH = 1000
_WHITESPACE = re.compile(r"\s")


@dataclass(frozen=True, slots=True)
class Ticket:
    """One request's claim on a model pool.

    ``request_id`` is for logs and traces; it need not be unique (clients may reuse their
    ``X-Request-Id``): the scheduler makes its own unique id for each acquire.
    ``replicas`` are (base URL, max in flight) pairs; ``rank`` 0 is served first;
    ``max_concurrent`` 0 means the use case has no such limit; ``cost`` is the token estimate
    (what fair sharing charges the tenant); ``prefix_hash`` (or "") keys prefix-cache affinity;
    ``limits`` are the rate limits acquire checks and counts in the same atomic call.
    """

    request_id: str
    model: str
    replicas: tuple[tuple[str, int], ...]
    rank: int
    priority_class: str
    queue_timeout_s: float
    max_queue_length: int
    tenant: str
    use_case_id: int | str
    max_concurrent: int = 0
    cost: int = 1
    prefix_hash: str = ""
    vllm_priority: int = 0
    limits: tuple[Limit, ...] = ()
    # The most of the pool the class may hold, in thousandths (1000: no bound): file and
    # async work run in classes that leave the rest to interactive traffic.
    pool_share: int = 1000
    # The prompt's token estimate (``cost`` less the completion): long prompts are kept
    # apart from short requests in pools with lanes (Scheduler ``long_prompt_tokens``).
    prompt_tokens: int = 0
    # The plan that made this ticket, if one did: what the scheduler keys its packed form of
    # the plan's fixed values on. A ticket changed in any other way than dropping its limits
    # or being split for a Cluster (accounts.split: a plan's tickets split alike) must drop
    # it too.
    plan: TicketPlan | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.rank <= MAX_RANK:
            raise ValueError(f"rank must be within 0..{MAX_RANK}, not {self.rank}")
        if self.queue_timeout_s <= 0:
            raise ValueError("queue_timeout_s must be positive")
        if self.cost < 1:
            raise ValueError("cost must be at least 1 token")
        if not self.request_id or _WHITESPACE.search(self.request_id):
            raise ValueError("request_id must be non-empty and without whitespace")


@dataclass(frozen=True, slots=True)
class Grant:
    """Capacity on one replica, held until ``Scheduler.release``.

    ``lease_id`` is the scheduler's own unique id for this acquire (what release and renew
    need); ``vllm_priority`` goes upstream as the request's ``priority``; ``admitted_ms`` is
    the clock acquire counted the rate limits at (what release reconciles against).
    """

    request_id: str
    lease_id: str
    model: str
    replica: str
    lease_ms: int
    vllm_priority: int
    queued_ms: float  # the whole acquire, queue wait and Valkey round trips included
    queued: bool = False  # True only when the request actually waited in the queue
    admitted_ms: int = 0
    # The slots besides the pool's it was charged on (Scheduler(split_slots=True) only):
    # settled on release, refunded if it was never served.
    accounts: tuple[Any, ...] = ()


def priority_class_for(policy: Policy, principal: Principal) -> PriorityClass:
    """The principal's class from the snapshot, or UNCLASSIFIED behind all the others."""
    return priority_class_named(policy, principal.priority_class)


def priority_class_named(policy: Policy, name: str | None) -> PriorityClass:
    """The class ``name`` from the snapshot, or UNCLASSIFIED behind all the others (a class
    the snapshot does not hold, or none at all)."""
    if name is not None:
        found = policy.priority_classes.get(name)
        if found is not None:
            return found
    classes = policy.priority_classes.values()
    return PriorityClass(
        name=UNCLASSIFIED,
        rank=min(MAX_RANK, max((c.rank for c in classes), default=-1) + 1),
        vllm_priority=max((c.vllm_priority for c in classes), default=-1) + 1,
        queue_timeout_s=DEFAULT_QUEUE_TIMEOUT_S,
        max_queue_length=DEFAULT_MAX_QUEUE_LENGTH,
    )


def ticket_for(
    policy: Policy,
    principal: Principal,
    model: Model,
    *,
    request_id: str,
    cost: int,
    prefix_hash: str = "",
    limits: Sequence[Limit] = (),
    prompt_tokens: int = 0,
) -> Ticket:
    """Everything the scheduler needs about a request, from the policy snapshot."""
    service_class = priority_class_for(policy, principal)
    use_case = policy.use_cases.get(principal.use_case_id)
    max_concurrent = (use_case.limits.max_concurrent or 0) if use_case is not None else 0
    return Ticket(
        request_id=request_id,
        model=model.public_id,
        replicas=tuple((url, model.max_in_flight_per_replica) for url in model.replicas),
        rank=min(service_class.rank, MAX_RANK),
        priority_class=service_class.name,
        queue_timeout_s=max(service_class.queue_timeout_s, 0.001),
        max_queue_length=service_class.max_queue_length,
        tenant=principal.tenant,
        use_case_id=principal.use_case_id,
        max_concurrent=max_concurrent,
        cost=max(cost, 1),
        prefix_hash=prefix_hash,
        vllm_priority=service_class.vllm_priority,
        limits=tuple(limits),
        pool_share=service_class.pool_share_permille,
        prompt_tokens=prompt_tokens,
    )


class TicketPlan:
    """What every request of one principal to one model shares under one policy snapshot:
    the class, the pool, the rate limits. Built once (``ticket_for`` and ``limits_for`` cost
    tens of microseconds), so that a request only fills in its id, token estimate and
    prefix; the ticket it makes is the one ``ticket_for`` would make."""

    __slots__ = ("_base", "_has_token_limits", "packed", "split_layout")

    def __init__(self, policy: Policy, principal: Principal, model: Model) -> None:
        limits = limits_for(policy, principal, model.base, 0)
        self._base = ticket_for(policy, principal, model, request_id="plan", cost=1, limits=limits)
        self._has_token_limits = any(limit.kind == "tok" for limit in limits)
        # The scheduler's packed form of the plan's fixed acquire values, made on first use
        # (scheduler.py); it lives and goes with the plan.
        self.packed: object = None
        # Where its limits go with split slots (accounts.py), made on first use.
        self.split_layout: object = None

    def ticket(
        self, *, request_id: str, cost: int, prefix_hash: str = "", prompt_tokens: int = 0
    ) -> Ticket:
        """This request's ticket; ``cost`` is its token estimate (what the token windows are
        charged and fair sharing weighs), ``prompt_tokens`` the prompt's part of it."""
        base = self._base
        limits = base.limits
        if self._has_token_limits:
            limits = tuple(
                limit
                if limit.kind == "req"
                else Limit(
                    limit.id, "tok", limit.window_ms, limit.limit, cost, limit.name, limit.slot
                )
                for limit in limits
            )
        return Ticket(
            request_id,
            base.model,
            base.replicas,
            base.rank,
            base.priority_class,
            base.queue_timeout_s,
            base.max_queue_length,
            base.tenant,
            base.use_case_id,
            base.max_concurrent,
            max(cost, 1),
            prefix_hash,
            base.vllm_priority,
            limits,
            base.pool_share,
            prompt_tokens,
            self,
        )


class TicketPlans:
    """The plans of one policy snapshot, made on first use; a new snapshot starts afresh.

    Keyed by the principal object itself (by identity: it lives as long as its snapshot, and
    hashing its fields would cost what the plan saves). Bounded: past ``max_plans`` the
    cache is emptied, which costs only rebuilding."""

    def __init__(self, max_plans: int = 10_000) -> None:
        self._policy: Policy | None = None
        self._plans: dict[tuple[int, str], tuple[Principal, TicketPlan]] = {}
        self._max = max_plans

    def plan(self, policy: Policy, principal: Principal, model: Model) -> TicketPlan:
        if policy is not self._policy:
            self._policy = policy
            self._plans = {}
        key = (id(principal), model.public_id)
        found = self._plans.get(key)
        if found is not None and found[0] is principal:
            return found[1]
        if len(self._plans) >= self._max:
            self._plans = {}
        plan = TicketPlan(policy, principal, model)
        # The principal is kept with its plan, so its id cannot be reused while cached.
        self._plans[key] = (principal, plan)
        return plan


def prefix_hash(text: str, *, chars: int = 2048) -> str:
    """A short key for a prompt's opening, for prefix-cache affinity ("" for no prompt).

    Hash what replicas cache first: for chat, the system message and the start of the
    first user message, concatenated.
    """
    if not text:
        return ""
    return hashlib.blake2b(text[:chars].encode(), digest_size=8).hexdigest()
