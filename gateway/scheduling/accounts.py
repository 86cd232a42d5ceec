"""A request's accounts: the limits and max-concurrent count that live outside its pool's slot.

On one Valkey, acquire.lua checks and counts every limit of a request wherever it lives, in
one atomic call. On a Valkey Cluster a script may touch one slot only, so a scheduler made
with ``split_slots=True`` first charges each other slot — the tenant's (tenant and use-case
limits, the use case's max concurrent) and the shared one (the global limit) — with
account.lua, and gives acquire.lua only the pool's own limits (docs/gateway-scheduling.md,
"Scale-out"). This module is the pure part: which account gets what.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gateway.admission.limits import Limit, limit_args
from gateway.autopipeline import Arg
from gateway.scheduling import keys
from gateway.scheduling.tickets import Ticket


@dataclass(frozen=True, slots=True)
class Account:
    """One slot a request is charged on besides its pool's."""

    slot: str  # the slot's key prefix (gateway/slots.py)
    concurrency_key: str  # the use case's set of requests in flight ("" for none)
    limits: tuple[Limit, ...]
    positions: tuple[int, ...]  # each limit's index in the ticket's limits


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where a ticket's limits go: the same for every ticket of a plan, so kept on it."""

    prefix: str
    limits: int  # how many limits the tickets it was made for have
    accounts: tuple[tuple[str, str, tuple[int, ...]], ...]  # slot, concurrency key, positions
    local: tuple[int, ...]  # the positions of the pool's own limits


def _layout(ticket: Ticket, prefix: str) -> _Layout:
    pool = keys.pool_prefix(ticket.model, prefix=prefix)
    tenant = keys.account_prefix(ticket.tenant, prefix=prefix)
    grouped: dict[str, list[int]] = {}
    if ticket.max_concurrent > 0:
        grouped[tenant] = []
    local = []
    for position, limit in enumerate(ticket.limits):
        if limit.slot == pool:
            local.append(position)
        else:
            grouped.setdefault(limit.slot, []).append(position)
    concurrency = (
        keys.concurrency(ticket.tenant, ticket.use_case_id, prefix=prefix)
        if ticket.max_concurrent > 0
        else ""
    )
    return _Layout(
        prefix=prefix,
        limits=len(ticket.limits),
        accounts=tuple(
            (slot, concurrency if slot == tenant else "", tuple(positions))
            for slot, positions in grouped.items()
        ),
        local=tuple(local),
    )


def split(ticket: Ticket, *, prefix: str = keys.KEY_PREFIX) -> tuple[tuple[Account, ...], Ticket]:
    """The ticket's accounts, and the ticket acquire.lua gets: the pool's own limits, no max
    concurrent (the tenant's account counts it). It keeps the ticket's plan: a plan's tickets
    always split alike, so where their limits go is worked out once and kept on the plan, and
    the scheduler packs the pool's part from the plan once (scheduler.py ``_PackedPlan``,
    made from the first such ticket)."""
    plan = ticket.plan
    layout = plan.split_layout if plan is not None else None
    if not isinstance(layout, _Layout) or layout.prefix != prefix:
        layout = _layout(ticket, prefix)
        if plan is not None:
            plan.split_layout = layout
    elif layout.limits != len(ticket.limits):  # (a plan's ticket that dropped limits)
        layout = _layout(ticket, prefix)
    if not layout.accounts:
        return (), ticket
    limits = ticket.limits
    accounts = tuple(
        Account(slot, concurrency, tuple(limits[i] for i in positions), positions)
        for slot, concurrency, positions in layout.accounts
    )
    local = tuple(limits[i] for i in layout.local)
    return accounts, replace(ticket, limits=local, max_concurrent=0)


def charge_args(
    account: Account, *, now: int, lease_id: str, max_concurrent: int, expiry_ms: int
) -> list[Arg]:
    """account.lua's ARGV for the charge."""
    return [
        "charge",
        now,
        lease_id,
        account.concurrency_key,
        max_concurrent,
        expiry_ms,
        *limit_args(account.limits),
    ]


def split_reconcile(
    reconcile: Sequence[Arg], accounts: Sequence[Account]
) -> tuple[list[Arg], dict[str, list[Arg]]]:
    """Token corrections (four values each, the first a limit's stem) for the pool's release
    and for each account's settle, by the slot their stem is in."""
    slots = [account.slot for account in accounts]
    pool: list[Arg] = []
    by_slot: dict[str, list[Arg]] = {slot: [] for slot in slots}
    for start in range(0, len(reconcile), 4):
        window = list(reconcile[start : start + 4])
        stem = window[0]
        stem = stem.decode() if isinstance(stem, bytes) else str(stem)
        owner = next((slot for slot in slots if stem.startswith(slot)), None)
        (pool if owner is None else by_slot[owner]).extend(window)
    return pool, by_slot
