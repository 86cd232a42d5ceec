"""Admission and queueing of async tasks: submit.lua, one atomic Valkey call per submit.

The rate limits are checked and counted as the synchronous path's acquire counts them (a
bulk call costs N requests and the sum of its token estimates), the model's backlog bound
is checked, and the tasks go to their partition streams with their hashes — or nothing is
written. The call goes over the gateway's auto-pipelined connection, so a submit costs one
round trip shared with every other request in flight, as an admission does.

On a Valkey Cluster (``split_slots``) a script may touch one slot only, and the limits live
in the tenant's and the pools' slots (gateway/slots.py): as the synchronous path does
(gateway/scheduling/accounts.py), each of those slots is first charged with account.lua,
then submit.lua runs on the task streams' slot with the limits that live there (the global
limit's, the shared slot), and any refusal or failure gives every charge back. A refused
submission counts nothing; the bound is the synchronous split path's (docs/async.md).
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.admission.limits import Limit, limit_args, limits_for
from gateway.async_tasks import layout
from gateway.autopipeline import Arg, AutoPipeline, bulk, pack_values
from gateway.policy import Policy, Principal
from gateway.scheduling import scheduler as scheduling
from gateway.scheduling.errors import MAX_RETRY_AFTER_S, RateLimited
from gateway.scheduling.keys import KEY_PREFIX
from runtime.valkey_urls import VALKEY_FAILURES

logger = logging.getLogger("gateway.async_tasks")

# A submit whose reply was lost: how often its outcome is asked (a Cluster pipe re-reads the
# slot map at most every 0.2 s after a node is unreachable, so three asks span a re-read).
_RESOLVE_ATTEMPTS = 3
_RESOLVE_PAUSE_S = 0.25

_HERE = Path(__file__).resolve().parent
SCRIPT = "async_submit"
ACCOUNT_SCRIPT = "account"  # the scheduler's account.lua, by the name it registers
# A drain rate older than this says nothing about now (the batchers may be gone).
DRAIN_RATE_FRESH_MS = 60_000
_PER_TASK = 2 + len(layout.ENTRY_FIELDS)  # task key, stream key, the entry's values


def lua_source() -> str:
    """submit.lua as loaded: limits.lua first, as for the scheduler's scripts. Not common.lua:
    submit.lua needs none of the queue's functions, and defining them all on every call
    cost Valkey about a fifth of a submit's time (measured)."""
    libraries = (_HERE.parent / "admission" / "limits.lua").read_text()
    return f"{libraries}\n{(_HERE / 'submit.lua').read_text()}"


def new_task_id() -> str:
    """Unguessable, so that an id in a log line is no handle on the task (reads are checked
    against the owner all the same)."""
    return layout.TASK_ID_PREFIX + secrets.token_hex(16)


@dataclass(frozen=True, slots=True)
class NewTask:
    """One task to queue: its stream entry's values, less what ``TaskQueue`` fills in."""

    model: str
    endpoint: str  # the synchronous path it runs as
    estimate: int
    deadline_ms: int
    callback_url: str
    body: bytes


@dataclass(frozen=True, slots=True)
class QueuedTask:
    id: str
    model: str
    endpoint: str
    created_ms: int
    deadline_ms: int
    expires_ms: int


class BacklogFull(Exception):
    """The model has as many tasks queued or running as it may (503, ``async_backlog_full``)."""

    code = "async_backlog_full"

    def __init__(self, model: str, *, retry_after_s: int) -> None:
        super().__init__(
            f"The async backlog of model '{model}' is full; retry after {retry_after_s}s."
        )
        self.model = model
        self.retry_after_s = retry_after_s


def merged_limits(per_task: Sequence[Sequence[Limit]]) -> list[Limit]:
    """One call's charge on each limit: the tasks' costs added up (requests N, tokens the
    sum), in the order the limits first appear (the most general first, as limits_for)."""
    if len(per_task) == 1:
        return list(per_task[0])
    merged: dict[str, Limit] = {}
    for limits in per_task:
        for limit in limits:
            found = merged.get(limit.id)
            if found is None:
                merged[limit.id] = limit
            else:
                merged[limit.id] = Limit(
                    found.id, found.kind, found.window_ms, found.limit,
                    found.cost + limit.cost, found.name, found.slot,
                )  # fmt: skip
    return list(merged.values())


class LimitPlan:
    """The rate limits of one principal on one model, and their submit.lua values packed
    once: a submit only splices in its token estimate (``limits_for`` and packing cost more
    than the rest of admitting a task)."""

    __slots__ = ("limits", "parts")

    def __init__(self, limits: Sequence[Limit]) -> None:
        self.limits = tuple(limits)  # costs: a request window 1, a token window 0
        parts: list[bytes] = []
        current = b""
        for limit in self.limits:
            current += pack_values((limit.stem, limit.kind, limit.window_ms, limit.limit))
            if limit.kind == "req":
                current += bulk(1)
            else:
                parts.append(current)
                current = b""
        parts.append(current)
        self.parts = tuple(parts)

    def packed(self, tokens: int) -> bytes:
        """One task's limits as submit.lua takes them, ``tokens`` charged on token windows."""
        return bulk(tokens).join(self.parts)

    def charged(self, tokens: int) -> list[Limit]:
        return [
            limit
            if limit.kind == "req"
            else Limit(
                limit.id, "tok", limit.window_ms, limit.limit, tokens, limit.name, limit.slot
            )
            for limit in self.limits
        ]


class LimitPlans:
    """The plans of one policy snapshot, made on first use (as scheduling's TicketPlans):
    keyed by the principal object itself, which lives as long as its snapshot."""

    def __init__(self, max_plans: int = 10_000) -> None:
        self._policy: Policy | None = None
        self._plans: dict[tuple[int, str], tuple[Principal, LimitPlan]] = {}
        self._max = max_plans

    def plan(self, policy: Policy, principal: Principal, model: str) -> LimitPlan:
        if policy is not self._policy:
            self._policy = policy
            self._plans = {}
        key = (id(principal), model)
        found = self._plans.get(key)
        if found is not None and found[0] is principal:
            return found[1]
        if len(self._plans) >= self._max:
            self._plans = {}
        plan = LimitPlan(limits_for(policy, principal, model, 0))
        self._plans[key] = (principal, plan)
        return plan


def backlog_retry_after_s(
    *, excess: int, rate: bytes | str, at_ms: bytes | str, now_ms: int, fallback_s: int
) -> int:
    """How long until the batchers have drained ``excess`` tasks at the rate they last
    reported; ``fallback_s`` without a fresh, positive rate."""
    try:
        per_second = float(rate)
        reported = int(at_ms)
    except ValueError:
        return fallback_s
    if not math.isfinite(per_second) or per_second <= 0 or now_ms - reported > DRAIN_RATE_FRESH_MS:
        return fallback_s
    return min(MAX_RETRY_AFTER_S, max(1, math.ceil(max(excess, 1) / per_second)))


class TaskQueue:
    """Queues tasks through submit.lua. One per gateway process."""

    def __init__(
        self,
        pipe: AutoPipeline,
        *,
        clock: Callable[[], int],
        max_backlog: int,
        queue_ttl_s: int,
        partitions: int,
        backlog_retry_after_s: int,
        prefix: str = KEY_PREFIX,
        split_slots: bool = False,
    ) -> None:
        pipe.register(SCRIPT, lua_source())
        # A Valkey Cluster: the limits outside the streams' slot are charged on their own
        # slots first (account.lua), as the synchronous path charges them.
        self.split_slots = split_slots
        if split_slots:
            pipe.register(ACCOUNT_SCRIPT, scheduling.lua_source(ACCOUNT_SCRIPT))
        self._background: set[asyncio.Future[None]] = set()
        self._route_key = prefix.encode()
        self._pipe = pipe
        self._clock = clock
        self._max_backlog = max_backlog
        self._ttl_ms = queue_ttl_s * 1000
        self._partitions = partitions
        self._fallback_s = backlog_retry_after_s
        self._prefix = prefix
        # model -> the partition count its registry entry holds, once it turned out not to be
        # this gateway's setting (an operator changed it; batchers follow the registry).
        self._registered: dict[str, int] = {}
        # The call's values that never change, packed once (a submit is on the hot path).
        self._numkeys_and_key = pack_values((1, prefix))
        self._backlog_and_ttl = pack_values((max_backlog, self._ttl_ms))
        self._registry_and_fields = pack_values(
            (layout.partitions_registry(prefix=prefix), len(layout.ENTRY_FIELDS),
             *layout.ENTRY_FIELDS)
        )  # fmt: skip
        # numkeys, key, now, max_backlog, ttl, result_ttl, registry, F, names, M, T
        self._fixed_count = 10 + len(layout.ENTRY_FIELDS)
        self._models: dict[tuple[str, int], tuple[bytes, bytes]] = {}

    def _model_part(self, model: str, count: int) -> bytes:
        """A model's five values: name, depth key, task count, partitions, drain-rate key."""
        partitions = self._registered.get(model, self._partitions)
        found = self._models.get((model, partitions))
        if found is None:
            if len(self._models) > 10_000:  # bounded by the policy's models in practice
                self._models.clear()
            found = self._models[(model, partitions)] = (
                pack_values((model, layout.depth(model, prefix=self._prefix))),
                pack_values((partitions, layout.drain_rate(model, prefix=self._prefix))),
            )
        return b"%s%s%s" % (found[0], bulk(count), found[1])

    async def submit(
        self,
        tasks: Sequence[NewTask],
        limits: Sequence[Limit],
        *,
        use_case_id: int,
        tenant: str,
        priority_class: str,
        result_ttl_s: int,
        packed_limits: bytes | None = None,
    ) -> list[QueuedTask]:
        """Queue ``tasks``, all or none. Raises RateLimited, BacklogFull, or a Valkey error.

        ``limits`` are the call's charges; ``packed_limits``, when given, the same already
        packed (LimitPlan.packed)."""
        task_ids = [new_task_id() for _ in tasks]
        if not self.split_slots:
            return await self._submit(
                tasks,
                task_ids,
                limits,
                packed_limits,
                use_case_id,
                tenant,
                priority_class,
                result_ttl_s,
            )
        local = [limit for limit in limits if limit.slot == self._prefix]
        elsewhere: dict[str, list[tuple[int, Limit]]] = {}
        for position, limit in enumerate(limits):
            if limit.slot != self._prefix:
                elsewhere.setdefault(limit.slot, []).append((position, limit))
        charge_id = "atq-" + secrets.token_hex(12)
        charged = await self._charge(elsewhere, charge_id)
        try:
            queued = await self._submit(
                tasks, task_ids, local, None, use_case_id, tenant, priority_class, result_ttl_s
            )
        except (RateLimited, BacklogFull):
            # Awaited: once the client has its refusal, the refusal has counted nothing.
            await self._settled(self._give_back(charged, charge_id, "refund"))
            raise
        except BaseException:  # failed or cancelled: submit.lua may have run, its reply lost
            if charged:
                await self._settled(
                    [self._in_background(self._resolve(charged, charge_id, task_ids[:1]))]
                )
            raise
        # Queued: the charges stand. Settling drops their refund records now rather than at
        # their TTL (an hour): a record per task for an hour would be most of the slot's memory.
        self._give_back(charged, charge_id, "settle")
        return queued

    async def _charge(
        self, elsewhere: dict[str, list[tuple[int, Limit]]], charge_id: str
    ) -> list[str]:
        """account.lua's charge on each slot (at once); the slots charged. A refusal or a
        failure on any gives the others back and raises (the first limit refused, in the
        call's order, as one atomic call would have named it)."""
        if not elsewhere:
            return []
        now = self._clock()
        slots = list(elsewhere)
        replies = await asyncio.gather(
            *(
                self._pipe.script(
                    ACCOUNT_SCRIPT,
                    [slot],
                    # No max concurrent (async work is not "in flight" at submit); the record
                    # is kept an hour past ``now``: the settle after the submit drops it.
                    [
                        "charge",
                        now,
                        charge_id,
                        "",
                        0,
                        now + 1,
                        *limit_args([limit for _, limit in elsewhere[slot]]),
                    ],
                )
                for slot in slots
            ),
            return_exceptions=True,
        )
        counted = [
            slot
            for slot, reply in zip(slots, replies, strict=True)
            if not isinstance(reply, BaseException) and int(reply[0]) == 1
        ]
        if len(counted) == len(slots):
            return slots
        await self._settled(self._give_back(counted, charge_id, "refund"))
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        refusals: list[tuple[int, Limit, int]] = []
        for slot, reply in zip(slots, replies, strict=True):
            answer: Any = reply  # (no exceptions left)
            if int(answer[0]) == -4:
                position, limit = elsewhere[slot][int(answer[2]) - 1]
                refusals.append((position, limit, int(answer[3])))
        if not refusals:
            raise RuntimeError(f"account.lua answered {replies!r}")
        _, limit, retry_after_ms = min(refusals, key=lambda found: found[0])
        raise RateLimited(limit, retry_after_ms=retry_after_ms)

    async def _resolve(self, charged: Sequence[str], charge_id: str, first: Sequence[str]) -> None:
        """After a submit whose outcome is unknown, settle the charges if its tasks are queued
        and refund them if not: submit.lua is all or nothing, so its first task's hash
        (``first``, empty for none) tells.

        A cancelled caller's submit is still ahead of the check on the same connection; after
        a lost connection the check goes out on a new one once the old one is gone. Left
        unanswered (the node is down) after the slot map is re-read, the charges stay counted
        until their windows pass: over-counting is the bounded error, never a queued task left
        uncounted."""
        if not first:  # no task: nothing can have been queued
            await self._settled(self._give_back(charged, charge_id, "refund"))
            return
        task_key = layout.task(first[0], prefix=self._prefix)
        for attempt in range(_RESOLVE_ATTEMPTS):
            try:
                queued = bool(await self._pipe.execute("EXISTS", task_key))
            except VALKEY_FAILURES as exc:
                if attempt + 1 < _RESOLVE_ATTEMPTS:
                    await asyncio.sleep(_RESOLVE_PAUSE_S)
                    continue
                logger.warning(
                    "async_submit_unresolved charge=%s kept_counted=%s error=%r",
                    charge_id,
                    ",".join(charged),
                    exc,
                )
                return
            break
        await self._settled(self._give_back(charged, charge_id, "settle" if queued else "refund"))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        """``work`` in a task of its own: a caller being cancelled does not stop it."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _give_back(
        self, slots: Sequence[str], charge_id: str, op: str
    ) -> list[asyncio.Future[None]]:
        """Refund (the submission was refused) or settle (queued) each slot's charge, in tasks
        of their own."""
        now = self._clock()
        return [
            self._in_background(self._account(slot, [op, now, charge_id, ""])) for slot in slots
        ]

    @staticmethod
    async def _settled(sent: list[asyncio.Future[None]]) -> None:
        if sent:
            await asyncio.wait(sent)

    async def _account(self, slot: str, args: list[Arg]) -> None:
        try:
            await self._pipe.script(ACCOUNT_SCRIPT, [slot], args)
        except VALKEY_FAILURES as exc:
            # A refund lost: the charge stays counted until its windows pass (an upper
            # bound, as for the synchronous path's); a settle lost: its record's TTL ends it.
            logger.warning("async_%s_failed slot=%s error=%r", args[0], slot, exc)

    async def _submit(
        self,
        tasks: Sequence[NewTask],
        task_ids: Sequence[str],
        limits: Sequence[Limit],
        packed_limits: bytes | None,
        use_case_id: int,
        tenant: str,
        priority_class: str,
        result_ttl_s: int,
    ) -> list[QueuedTask]:
        for _ in range(2):
            now = self._clock()
            expires = now + self._ttl_ms
            counts: dict[str, int] = {}
            for task in tasks:
                counts[task.model] = counts.get(task.model, 0) + 1
            parts = [
                self._numkeys_and_key,
                bulk(now),
                self._backlog_and_ttl,
                bulk(result_ttl_s),
                self._registry_and_fields,
                bulk(len(counts)),
            ]
            for model, count in counts.items():
                parts.append(self._model_part(model, count))
            parts.append(bulk(len(tasks)))
            queued: list[QueuedTask] = []
            for task, task_id in zip(tasks, task_ids, strict=True):
                partitions = self._registered.get(task.model, self._partitions)
                parts.append(
                    pack_values(
                        (
                            layout.task(task_id, prefix=self._prefix),
                            layout.stream(
                                task.model,
                                layout.partition_of(task_id, partitions),
                                prefix=self._prefix,
                            ),
                            # layout.ENTRY_FIELDS, in its order
                            task_id,
                            task.endpoint,
                            task.model,
                            use_case_id,
                            tenant,
                            priority_class,
                            task.estimate,
                            now,
                            task.deadline_ms,
                            expires,
                            task.callback_url,
                            task.body,
                        )
                    )
                )
                queued.append(
                    QueuedTask(task_id, task.model, task.endpoint, now, task.deadline_ms, expires)
                )
            if packed_limits is not None:
                parts.append(packed_limits)
            elif limits:
                parts.append(pack_values(limit_args(limits)))
            call = b"".join(parts)
            count = self._fixed_count + 5 * len(counts) + len(tasks) * _PER_TASK + 5 * len(limits)
            reply = await (
                await self._pipe.send_packed_script(SCRIPT, call, count, key=self._route_key)
            )
            status = int(reply[0])
            if status == 1:
                return queued
            if status == -4:
                raise RateLimited(limits[int(reply[2]) - 1], retry_after_ms=int(reply[3]))
            model = list(counts)[int(reply[2]) - 1]
            if status == -5:
                depth = int(reply[3])
                raise BacklogFull(
                    model,
                    retry_after_s=backlog_retry_after_s(
                        excess=depth + counts[model] - self._max_backlog,
                        rate=reply[4],
                        at_ms=reply[5],
                        now_ms=now,
                        fallback_s=self._fallback_s,
                    ),
                )
            if status != -3:
                raise RuntimeError(f"submit.lua answered {reply!r}")
            self._registered[model] = int(reply[3])
        raise RuntimeError("submit.lua kept answering another partition count")
