"""The global priority queue, fair sharing, capacity and leases: Python around six Lua scripts.

Every decision is one atomic script on the shared Valkey, so any number of gateway processes
enforce one capacity; this class only waits. One ``Scheduler`` per gateway process. The
scripts go over one auto-pipelined connection (gateway/autopipeline.py): a request costs two
round trips that it shares with every other request in flight, acquire and release.

- ``acquire`` runs acquire.lua: the ticket's rate limits, then granted now or enqueued; an
  enqueued request waits for the message its grant publishes on ``sy:gw:<gateway_id>`` (a
  listener task resolves a local future), polling ``grant:<id>`` every ``poll_interval_s``
  in case a message was lost.
- ``release`` runs release.lua, which also reconciles the token windows and grants the next
  waiters (on whichever gateway).
- One renewal task extends every lease this process holds, in one call every lease_ms / 3.
- Every key of a model pool is in that pool's own slot (gateway/slots.py), so each script
  call names its pool's prefix; a request's use case max-concurrent count is in its tenant's
  slot. A gateway "joins" a pool before its first request there: its heartbeat goes into the
  pool's slot, and the pool into the shared registry of pools the reapers walk.
- A reaper task writes this gateway's heartbeat every second into each pool it has joined
  (``sy:{sy/<model>}:gws``: gateway id → expiry, ``heartbeat_ms`` ahead) and runs reap.lua
  on every pool of the registry every ``reap_interval_s``: the leases
  and waiters of a gateway whose heartbeat expired are released and dropped (a process
  killed with requests in flight gives its capacity back within ``heartbeat_ms``, not the
  lease), leases past their expiry are released, and waiters past their deadline dropped.
  Pumps never grant a waiter whose gateway has no live heartbeat.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import valkey.asyncio as avalkey
from valkey.asyncio.client import PubSub

from gateway.admission.limits import Limit, limit_args
from gateway.autopipeline import Arg, AutoPipeline, bulk, pack_values
from gateway.scheduling import accounts as slot_accounts
from gateway.scheduling import keys
from gateway.scheduling.accounts import Account
from gateway.scheduling.clock import ValkeyClock
from gateway.scheduling.errors import (
    MaxConcurrent,
    QueueFull,
    QueueLost,
    QueueTimeout,
    RateLimited,
    retry_after_s,
)
from gateway.scheduling.tickets import Grant, Ticket
from runtime.valkey_urls import VALKEY_FAILURES

logger = logging.getLogger("gateway.scheduling")

_HERE = Path(__file__).resolve().parent
_LIMITS_LUA = _HERE.parent / "admission" / "limits.lua"
SCRIPT_NAMES = ("acquire", "release", "pump", "cancel", "reap", "renew", "peek", "account")
RENEW_BATCH = 500  # leases per renew.lua call
# Long-prompt lanes pay only where short traffic keeps replicas of its own while one runs
# long prompts: with two, short traffic would be left a single replica
# (docs/gateway-scheduling.md, "Long prompts").
LANE_MIN_REPLICAS = 3
_PACKED_LONG = {True: bulk(b"1"), False: bulk(b"0")}


def lua_source(name: str) -> str:
    """A script as it is loaded: limits.lua, common.lua (but for account.lua, which needs
    only the limits), then the script (one atomic call)."""
    libraries = _LIMITS_LUA.read_text()
    if name != "account":
        libraries += "\n" + (_HERE / "common.lua").read_text()
    return f"{libraries}\n{(_HERE / f'{name}.lua').read_text()}"


def wall_ms() -> int:
    """Milliseconds of this host's wall clock (tests and tools; the scheduler itself reads
    Valkey's clock, gateway/scheduling/clock.py)."""
    return int(time.time() * 1000)


class _KeepAlive:
    """What ``Scheduler.keep_alive`` returns: a plain class, as cheap as an async context
    manager gets (it runs on every request)."""

    __slots__ = ("_grant", "_reconcile", "_refund_on", "_scheduler", "_wait")

    def __init__(
        self,
        scheduler: Scheduler,
        grant: Grant,
        reconcile: Callable[[], Sequence[Arg]] | None,
        wait: bool,
        refund_on: tuple[type[BaseException], ...],
    ) -> None:
        self._scheduler = scheduler
        self._grant = grant
        self._reconcile = reconcile
        self._wait = wait
        self._refund_on = refund_on

    async def __aenter__(self) -> Grant:
        self._scheduler._held[self._grant.lease_id] = self._grant
        return self._grant

    async def __aexit__(
        self, kind: type[BaseException] | None, error: object, traceback: object
    ) -> None:
        scheduler, grant = self._scheduler, self._grant
        try:
            if kind is not None and self._refund_on and issubclass(kind, self._refund_on):
                # The grant was never used (no replica took the request): give the capacity
                # back and refund the rate-limit charge, as for a waiter that gave up.
                await scheduler.release_unused(grant)
                return
            reconcile = self._reconcile() if self._reconcile is not None else ()
            if self._wait:
                await scheduler.release(grant, reconcile)
            else:
                sent = await scheduler.send_release(grant, reconcile)
                sent.add_done_callback(lambda reply: scheduler._released(grant.lease_id, reply))
        except VALKEY_FAILURES as exc:
            # Not worth masking the request's own outcome: the lease expires and a reaper
            # returns the capacity within about lease_ms.
            logger.warning("scheduler_release_failed lease=%s error=%r", grant.lease_id, exc)


class _PackedPlan:
    """acquire.lua's values that one ticket plan fixes, packed once (libvalkey's packing of
    ~40 values is most of what preparing the call costs). The values that differ per request
    go between the parts: see ``Scheduler._acquire_call``."""

    __slots__ = (
        "count",
        "keys",
        "limit_parts",
        "limits",
        "model_to_max_concurrent",
        "pool",
        "scheduler",
        "token_at",
    )

    def __init__(self, scheduler: Scheduler, ticket: Ticket) -> None:
        self.scheduler = scheduler  # its staleness bound and threshold are in ``pool``
        # numkeys and the keys: the pool's and the tenant's slots, or with split slots (a
        # Cluster) the pool's alone — a count packed wrong desynchronises the connection.
        slots = scheduler._acquire_keys(ticket)
        self.keys = pack_values([len(slots), *slots])
        self.model_to_max_concurrent = pack_values(_class_values(ticket))
        self.pool = pack_values(scheduler._pool_values(ticket))
        # The limits, cut where a token window's cost (this request's estimate) goes; a
        # request window's cost is always 1.
        parts: list[bytes] = []
        current = b""
        self.token_at = -1
        for index, limit in enumerate(ticket.limits):
            current += pack_values([limit.stem, limit.kind, limit.window_ms, limit.limit])
            if limit.kind == "req":
                current += bulk(limit.cost)
            else:
                parts.append(current)
                current = b""
                if self.token_at < 0:
                    self.token_at = index
        parts.append(current)
        self.limit_parts = tuple(parts)
        self.limits = len(ticket.limits)
        self.count = 1 + len(slots) + 20 + 2 * len(ticket.replicas) + 5 * len(ticket.limits)


def _class_values(ticket: Ticket) -> list[Arg]:
    """acquire.lua's ARGV[3..10]: the ticket's model, class, use case and class share."""
    return [
        ticket.model,
        ticket.rank,
        ticket.priority_class,
        ticket.max_queue_length,
        ticket.tenant,
        ticket.use_case_id,
        ticket.max_concurrent,
        ticket.pool_share,
    ]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _per_second(reply: Sequence[Any], index: int) -> float:
    """A rate the scripts give per 1000 s (replies carry integers); 0 when absent."""
    return int(reply[index]) / 1000 if len(reply) > index else 0.0


class Scheduler:
    """Admission to a model pool's capacity, shared by every gateway process through Valkey."""

    def __init__(
        self,
        client: avalkey.Valkey,
        *,
        gateway_id: str | None = None,
        lease_ms: int = 30_000,
        stale_ms: int = 1_000,
        waiting_threshold: int = 3,
        long_prompt_tokens: int = 0,
        poll_interval_s: float = 0.2,
        reap_interval_s: float = 1.0,
        heartbeat_ms: int = 5_000,
        clock: Callable[[], int] | None = None,
        prefix: str = keys.KEY_PREFIX,
        pipe: AutoPipeline | None = None,
        split_slots: bool = False,
    ) -> None:
        self.gateway_id = gateway_id or (
            f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        self.lease_ms = lease_ms
        self.stale_ms = stale_ms
        self.waiting_threshold = waiting_threshold
        # Prompts of at least this many tokens run apart from short requests, in pools of
        # LANE_MIN_REPLICAS or more (common.lua pick); 0: no lanes.
        self.long_prompt_tokens = long_prompt_tokens
        self._client = client
        self._owns_pipe = pipe is None
        self.pipe = pipe if pipe is not None else AutoPipeline(client)
        for name in SCRIPT_NAMES:
            self.pipe.register(name, lua_source(name))
        self._poll_s = poll_interval_s
        self._reap_s = reap_interval_s
        self.heartbeat_ms = heartbeat_ms
        # Refreshed five times per heartbeat: four refreshes may fail before it expires.
        self._beat_s = min(reap_interval_s, heartbeat_ms / 5000)
        # Valkey's clock unless a test drives its own: the scripts compare times written by
        # other gateways and the fleet watcher, so one clock must stamp them all.
        self._valkey_clock = ValkeyClock() if clock is None else None
        self._clock: Callable[[], int] = clock or self._valkey_clock or wall_ms
        self._prefix = prefix
        # A Valkey Cluster: the limits outside a pool's slot are charged by account.lua on
        # their own slots first (gateway/scheduling/accounts.py); else acquire.lua does all.
        self.split_slots = split_slots
        # model -> [its pool's slot prefix]: the KEYS of every script but acquire's.
        self._pool_keys: dict[str, list[Arg]] = {}
        self._route_keys: dict[str, bytes] = {}
        # Pools this gateway has joined (its heartbeat is in their slots).
        self._pools: set[str] = set()
        # Lease ids: unique without a random number per request.
        self._lease_tag = secrets.token_hex(4)
        self._lease_seq = itertools.count(1)
        self._waiting: dict[str, asyncio.Future[str]] = {}
        # (model, class) -> requests of this process waiting in that queue (queue_depths).
        self._queued: collections.Counter[tuple[str, str]] = collections.Counter()
        self._held: dict[str, Grant] = {}
        self._lease_and_gateway = pack_values([lease_ms, self.gateway_id])
        self._background: set[asyncio.Future[Any]] = set()
        self._pubsub: PubSub | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Announce this gateway (its heartbeat), subscribe to its channel, start the reaper
        (which keeps the heartbeat) and the renewals. Idempotent."""
        if self._pubsub is not None:
            return
        # Before any request can wait: a pump drops waiters of a gateway without heartbeat.
        await self.heartbeat()
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        await self._pubsub.subscribe(keys.gateway_channel(self.gateway_id))
        self._tasks = [
            asyncio.create_task(self._listen(), name=f"scheduler-listen-{self.gateway_id}"),
            asyncio.create_task(self._reap_forever(), name=f"scheduler-reap-{self.gateway_id}"),
            asyncio.create_task(self._renew_forever(), name=f"scheduler-renew-{self.gateway_id}"),
        ]

    async def close(self) -> None:
        """Stop listening, reaping and renewing; waits for replies still on their way."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._background:
            await asyncio.wait(self._background, timeout=2.0)
        if self._pubsub is not None:
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]  # untyped in valkey-py
            self._pubsub = None
        if self._owns_pipe:
            await self.pipe.close()

    # -- the request path ---------------------------------------------------------------

    async def acquire(self, ticket: Ticket) -> Grant:
        """Capacity on a replica of ``ticket.model``: at once, or after waiting in its queue.

        Checks and counts ``ticket.limits`` in the same atomic call. Raises RateLimited,
        MaxConcurrent, QueueFull or QueueTimeout (each with ``retry_after_s``). If the
        awaiting task is cancelled (the client went away), the request leaves the queue, and
        a grant that raced in is released, before CancelledError propagates.
        """
        if self._pubsub is None:
            raise RuntimeError("Scheduler.start() must run before acquire()")
        if ticket.model not in self._pools:
            await self.join(ticket.model)
        lease_id = f"{ticket.request_id}.{self._lease_tag}{next(self._lease_seq):x}"
        granted: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[lease_id] = granted
        started = time.monotonic()
        now = self._clock()
        charged: tuple[Account, ...] = ()
        if self.split_slots:
            try:
                charged, ticket = await self._charge_accounts(ticket, lease_id, now)
            except BaseException:
                self._waiting.pop(lease_id, None)
                raise
        try:
            call, count = self._acquire_call(ticket, lease_id, now)
            reply = await (
                await self.pipe.send_packed_script(
                    "acquire", call, count, key=self._route_key(ticket.model)
                )
            )
            status = int(reply[0])
            if status == 1:
                return self._grant(
                    ticket, lease_id, _text(reply[1]), started, now, queued=False, charged=charged
                )
            if status == -4:
                raise RateLimited(ticket.limits[int(reply[2]) - 1], retry_after_ms=int(reply[3]))
            if status == -1:
                running, hold = int(reply[2]), int(reply[3])
                raise MaxConcurrent(
                    f"Use case {ticket.use_case_id} already has {running} requests waiting or "
                    f"in flight, its maximum.",
                    retry_after_s=retry_after_s(
                        ahead=0, hold_ms=hold, in_flight=running, fallback_s=1.0
                    ),
                )
            if status == -2:
                raise QueueFull(
                    f"The {ticket.priority_class} queue for {ticket.model} is full.",
                    retry_after_s=retry_after_s(
                        ahead=int(reply[2]),
                        hold_ms=int(reply[3]),
                        in_flight=int(reply[4]),
                        fallback_s=ticket.queue_timeout_s,
                        higher_rate_per_s=_per_second(reply, 5),
                    ),
                )
            if status != 0:
                raise RuntimeError(f"acquire.lua answered {reply!r} for a fresh lease id")
            replica = await self._wait(ticket, lease_id, granted, started)
            return self._grant(
                ticket, lease_id, replica, started, now, queued=True, charged=charged
            )
        except (RateLimited, MaxConcurrent, QueueFull, QueueTimeout):  # QueueLost too
            self._refund_accounts(charged, lease_id)
            raise
        except BaseException:
            self._refund_accounts(charged, lease_id)
            # Cancelled (or Valkey failed) at any point: whatever acquire.lua did — enqueue or
            # grant, even one that raced in just now — is undone before the error goes on.
            # The pipe runs commands in order, so the cancel lands after the acquire.
            self._send_nowait("cancel", ticket.model, [self._clock(), lease_id, ticket.model, "0"])
            raise
        finally:
            self._waiting.pop(lease_id, None)

    async def check_limits(self, ticket: Ticket) -> None:
        """RateLimited if ``acquire`` would refuse ``ticket`` on its rate limits now; counts
        nothing (peek.lua). For work that must not run for a request over its limits (request
        guardrails); ``acquire`` remains the one that counts."""
        if not ticket.limits:
            return
        now = self._clock()
        groups: dict[str, list[Limit]] = {}
        for limit in ticket.limits:  # one call per slot: on a Cluster a script has one
            slot = limit.slot if self.split_slots else self._keys(ticket.model)[0]
            groups.setdefault(str(slot), []).append(limit)
        replies = await asyncio.gather(
            *(
                self.pipe.script("peek", [slot], [now, *limit_args(limits)])
                for slot, limits in groups.items()
            )
        )
        refusals = [
            (ticket.limits.index(limits[int(reply[2]) - 1]), limits[int(reply[2]) - 1], reply)
            for (_, limits), reply in zip(groups.items(), replies, strict=True)
            if int(reply[0]) == -4
        ]
        if refusals:
            _, limit, reply = min(refusals, key=lambda found: found[0])
            raise RateLimited(limit, retry_after_ms=int(reply[3]))

    def acquire_args(self, ticket: Ticket, lease_id: str, now: int) -> list[Arg]:
        """acquire.lua's ARGV for this ticket (acquire.lua's header says what each is)."""
        args: list[Arg] = [
            now,
            lease_id,
            *_class_values(ticket),
            ticket.cost,
            ticket.prefix_hash,
            1 if self._is_long(ticket) else 0,
            self.lease_ms,
            self.gateway_id,
            now + max(1, round(ticket.queue_timeout_s * 1000)),
            *self._pool_values(ticket),
        ]
        if ticket.limits:
            args += limit_args(ticket.limits)
        return args

    def _route_key(self, model: str) -> bytes:
        """The pool's slot prefix as bytes: what a Cluster routes the pool's scripts by."""
        found = self._route_keys.get(model)
        if found is None:
            found = self._route_keys[model] = str(self._keys(model)[0]).encode()
        return found

    def _keys(self, model: str) -> list[Arg]:
        """KEYS of a script on ``model``'s pool: its slot's prefix."""
        found = self._pool_keys.get(model)
        if found is None:
            found = self._pool_keys[model] = [keys.pool_prefix(model, prefix=self._prefix)]
        return found

    def _acquire_keys(self, ticket: Ticket) -> list[Arg]:
        """acquire.lua's KEYS: the pool's slot, then the tenant's (max concurrent) — but with
        split slots the pool's alone: a Cluster refuses a call naming two slots, and the
        tenant's account counts max concurrent there (accounts.py)."""
        if self.split_slots:
            return list(self._keys(ticket.model))
        return [*self._keys(ticket.model), keys.account_prefix(ticket.tenant, prefix=self._prefix)]

    def _lanes(self, ticket: Ticket) -> bool:
        """Whether the ticket's pool keeps long prompts apart (docs/gateway-scheduling.md)."""
        return self.long_prompt_tokens > 0 and len(ticket.replicas) >= LANE_MIN_REPLICAS

    def _is_long(self, ticket: Ticket) -> bool:
        """acquire.lua's ``long``: a long prompt in a pool with lanes."""
        return ticket.prompt_tokens >= self.long_prompt_tokens > 0 and self._lanes(ticket)

    def _pool_values(self, ticket: Ticket) -> list[Arg]:
        """acquire.lua's pool: the staleness bound, the threshold, whether it has lanes,
        then replica/cap pairs."""
        values: list[Arg] = [
            self.stale_ms,
            self.waiting_threshold,
            1 if self._lanes(ticket) else 0,
            len(ticket.replicas),
        ]
        for url, cap in ticket.replicas:
            values += [url, cap]
        return values

    def _acquire_call(self, ticket: Ticket, lease_id: str, now: int) -> tuple[bytes, int]:
        """acquire.lua's call packed (numkeys, the key, ``acquire_args``) and its length.

        A ticket made by a plan reuses the plan's fixed values, packed once; the bytes are
        the same either way (tests/gateway/scheduling/test_scheduler.py holds them so)."""
        plan = ticket.plan
        packed: _PackedPlan | None = None
        if plan is not None:
            found = plan.packed
            if isinstance(found, _PackedPlan) and found.scheduler is self:
                packed = found
            else:
                packed = plan.packed = _PackedPlan(self, ticket)
        if packed is None or packed.limits != len(ticket.limits):
            args = self.acquire_args(ticket, lease_id, now)
            slots = self._acquire_keys(ticket)
            return pack_values([len(slots), *slots, *args]), 1 + len(slots) + len(args)
        tokens = bulk(ticket.limits[packed.token_at].cost) if packed.token_at >= 0 else b""
        deadline = now + max(1, round(ticket.queue_timeout_s * 1000))
        call = b"".join(
            (
                packed.keys,
                bulk(now),
                bulk(lease_id),
                packed.model_to_max_concurrent,
                bulk(ticket.cost),
                bulk(ticket.prefix_hash),
                _PACKED_LONG[self._is_long(ticket)],
                self._lease_and_gateway,
                bulk(deadline),
                packed.pool,
                tokens.join(packed.limit_parts),
            )
        )
        return call, packed.count

    async def release(self, grant: Grant, reconcile: Sequence[Arg] = ()) -> int:
        """Give the capacity back; returns how many waiters that granted. Idempotent.

        ``reconcile``: token-window corrections (admission.reconcile_args), applied in the
        same call. The command is on its way before the first suspension, so a caller
        cancelled while waiting for the reply still releases.
        """
        reply = await (await self.send_release(grant, reconcile))
        return int(reply[1])

    async def send_release(
        self, grant: Grant, reconcile: Sequence[Arg] = ()
    ) -> asyncio.Future[Any]:
        """``release``, returning once the command is on its way: its reply's future."""
        self._held.pop(grant.lease_id, None)
        now = self._clock()
        if grant.accounts:
            reconcile, by_slot = slot_accounts.split_reconcile(reconcile, grant.accounts)
            for account in grant.accounts:
                args: list[Arg] = [
                    "settle",
                    now,
                    grant.lease_id,
                    account.concurrency_key,
                    *by_slot[account.slot],
                ]
                self._send_nowait("account", account.slot, args, slot=True)
        args = [now, grant.lease_id, grant.model, *reconcile]
        return await self.pipe.send_script("release", self._keys(grant.model), args)

    async def release_unused(self, grant: Grant) -> None:
        """Release a grant no replica served: capacity back, rate-limit charge refunded,
        waiters pumped (cancel.lua's granted path), so a retry is charged afresh."""
        self._held.pop(grant.lease_id, None)
        self._refund_accounts(grant.accounts, grant.lease_id)
        await self.pipe.script(
            "cancel", self._keys(grant.model), [self._clock(), grant.lease_id, grant.model, "0"]
        )

    @contextlib.asynccontextmanager
    async def hold(self, ticket: Ticket) -> AsyncIterator[Grant]:
        """``async with scheduler.hold(ticket) as grant:`` acquire, keep alive, always release."""
        grant = await self.acquire(ticket)
        async with self.keep_alive(grant):
            yield grant

    def keep_alive(
        self,
        grant: Grant,
        reconcile: Callable[[], Sequence[Arg]] | None = None,
        *,
        wait_for_release: bool = True,
        refund_on: tuple[type[BaseException], ...] = (),
    ) -> _KeepAlive:
        """``async with scheduler.keep_alive(grant):`` renew ``grant`` while the block runs;
        release it on any exit.

        ``reconcile``, if given, is asked at the exit for release's token corrections (what
        the request really used is known only then). ``wait_for_release=False``: the exit
        returns once the release is on its way, without waiting for Valkey's reply (the
        gateway's request path, where nobody needs it; a failure is logged all the same).
        ``refund_on``: exceptions that mean the grant was never used (a replica that could
        not be reached); leaving with one releases it with ``release_unused`` instead.
        """
        return _KeepAlive(self, grant, reconcile, wait_for_release, refund_on)

    def _released(self, lease_id: str, reply: asyncio.Future[Any]) -> None:
        """The reply to a release nobody waited for: only a failure needs saying."""
        error = reply.exception() if not reply.cancelled() else None
        if error is not None:
            logger.warning("scheduler_release_failed lease=%s error=%r", lease_id, error)

    # -- for the fleet watcher and operators ---------------------------------------------

    async def pump(self, model: str) -> int:
        """Grant waiters of ``model`` while a replica has room; returns how many."""
        return int(await self.pipe.script("pump", self._keys(model), [self._clock(), model]))

    def now_ms(self) -> int:
        """The time the scripts are given (Valkey's clock): for anything written next to
        what they compare, such as a fleet entry marking a replica saturated."""
        return self._clock()

    async def heartbeat(self) -> None:
        """Say this gateway is alive for the next ``heartbeat_ms`` in every pool it has
        joined (the reaper repeats it). Re-measures Valkey's clock first, so the expiry is in
        the clock reapers compare."""
        if self._valkey_clock is not None:
            await self._valkey_clock.sync(self._server_time)
        expiry = self._clock() + self.heartbeat_ms
        if self._pools:
            registry = keys.pools(prefix=self._prefix)
            commands: list[tuple[Arg, ...]] = []
            for model in sorted(self._pools):
                commands.append(
                    ("ZADD", keys.gateways(model, prefix=self._prefix), expiry, self.gateway_id)
                )
                # Again each time: a Valkey that lost its data (a restart without persistence)
                # would otherwise leave the pool out of every reaper's walk.
                commands.append(("SADD", registry, model))
            await self.pipe.execute_many(commands)

    async def join(self, model: str) -> None:
        """Before this gateway's first request in ``model``'s pool: its heartbeat there (a
        pump drops the waiters of a gateway without one) and the pool in the registry the
        reapers walk. Idempotent; once per pool and process on the request path."""
        await self.pipe.execute_many(
            [
                (
                    "ZADD",
                    keys.gateways(model, prefix=self._prefix),
                    self._clock() + self.heartbeat_ms,
                    self.gateway_id,
                ),
                ("SADD", keys.pools(prefix=self._prefix), model),
            ]
        )
        self._pools.add(model)

    async def _server_time(self) -> Any:
        return await self.pipe.execute("TIME")

    async def reap(self) -> tuple[int, int, int]:
        """One reaper pass over every pool of the registry, one reap.lua call each (a pool's
        slot is its own): (leases released, waiters dropped, waiters granted)."""
        models = await self.pipe.execute("SMEMBERS", keys.pools(prefix=self._prefix))
        now = self._clock()
        replies = await asyncio.gather(
            *(self.pipe.script("reap", self._keys(_text(m)), [now]) for m in sorted(models))
        )
        return (
            sum(int(r[0]) for r in replies),
            sum(int(r[1]) for r in replies),
            sum(int(r[2]) for r in replies),
        )

    async def renew_held(self) -> int:
        """Extend every lease this process holds; returns how many were lost (reaped)."""
        by_model: dict[str, list[Grant]] = {}
        for grant in list(self._held.values()):
            by_model.setdefault(grant.model, []).append(grant)
        lost = 0
        for model, held in by_model.items():  # one pool's slot per call
            for start in range(0, len(held), RENEW_BATCH):
                batch = held[start : start + RENEW_BATCH]
                args: list[Arg] = [self._clock(), self.lease_ms]
                for grant in batch:
                    args += [grant.lease_id, grant.model]
                renewed = await self.pipe.script("renew", self._keys(model), args)
                for grant, ok in zip(batch, renewed, strict=True):
                    if not int(ok) and self._held.pop(grant.lease_id, None) is not None:
                        lost += 1
                        logger.warning("scheduler_lease_lost lease=%s", grant.lease_id)
        await self._renew_accounts()
        return lost

    async def _renew_accounts(self) -> None:
        """Keep the held requests in their use cases' sets (split slots: account.lua)."""
        by_slot: dict[str, list[Arg]] = {}
        for grant in self._held.values():
            for account in grant.accounts:
                if account.concurrency_key:
                    by_slot.setdefault(account.slot, []).extend(
                        (account.concurrency_key, grant.lease_id)
                    )
        if by_slot:
            now = self._clock()
            await asyncio.gather(
                *(
                    self.pipe.script("account", [slot], ["renew", now, now + self.lease_ms, *pairs])
                    for slot, pairs in by_slot.items()
                )
            )

    # -- internals -----------------------------------------------------------------------

    def _grant(
        self,
        ticket: Ticket,
        lease_id: str,
        replica: str,
        started: float,
        now: int,
        *,
        queued: bool,
        charged: tuple[Account, ...] = (),
    ) -> Grant:
        return Grant(
            request_id=ticket.request_id,
            lease_id=lease_id,
            model=ticket.model,
            replica=replica,
            lease_ms=self.lease_ms,
            vllm_priority=ticket.vllm_priority,
            queued_ms=(time.monotonic() - started) * 1000,
            queued=queued,
            admitted_ms=now,
            accounts=charged,
        )

    def queue_depths(self) -> dict[tuple[str, str], int]:
        """(model, priority class) -> this process's requests waiting in that queue now: the
        gateway's queue-depth gauge, read when it is scraped (an autoscaler's signal)."""
        return dict(self._queued)

    async def _wait(
        self, ticket: Ticket, lease_id: str, granted: asyncio.Future[str], started: float
    ) -> str:
        where = (ticket.model, ticket.priority_class)
        self._queued[where] += 1  # only waiting requests pay this: a dict update
        try:
            return await self._wait_for_grant(ticket, lease_id, granted, started)
        finally:
            self._queued[where] -= 1

    async def _wait_for_grant(
        self, ticket: Ticket, lease_id: str, granted: asyncio.Future[str], started: float
    ) -> str:
        deadline = started + ticket.queue_timeout_s
        grant_key = keys.grant(lease_id, ticket.model, prefix=self._prefix)
        waiter_key = keys.waiter(lease_id, ticket.model, prefix=self._prefix)
        while (remaining := deadline - time.monotonic()) > 0:
            await asyncio.wait((granted,), timeout=min(self._poll_s, remaining))
            if granted.done():
                return granted.result()
            # The message may have been lost (listener reconnecting): the key says it too.
            # In this order: a grant takes the place and writes the key in one script.
            waiting = await self._client.exists(waiter_key)
            replica = await self._client.get(grant_key)
            if replica is not None:
                return _text(replica)
            if not waiting and deadline - time.monotonic() > self._poll_s:
                # Neither waiting nor granted, well before the deadline (at it, the reaper
                # may have dropped the place first: a timeout, said below).
                if granted.done():  # the message came in meanwhile
                    return granted.result()
                raise QueueLost(
                    f"The request's place in the {ticket.priority_class} queue for "
                    f"{ticket.model} was lost (Valkey failed over or restarted); retry.",
                    retry_after_s=1,
                )
        reply = await self.pipe.script(
            "cancel", self._keys(ticket.model), [self._clock(), lease_id, ticket.model, "1"]
        )
        if int(reply[0]) == 2:  # granted at the last moment: better served than refused
            return _text(reply[1])
        ahead, hold, in_flight, higher = (
            (int(reply[1]), int(reply[2]), int(reply[3]), _per_second(reply, 4))
            if int(reply[0]) == 1
            else (0, -1, 0, 0.0)
        )
        raise QueueTimeout(
            f"No capacity for {ticket.model} within the {ticket.priority_class} queue timeout "
            f"of {ticket.queue_timeout_s:g} s.",
            retry_after_s=retry_after_s(
                ahead=ahead,
                hold_ms=hold,
                in_flight=in_flight,
                fallback_s=ticket.queue_timeout_s,
                higher_rate_per_s=higher,
            ),
        )

    async def _charge_accounts(
        self, ticket: Ticket, lease_id: str, now: int
    ) -> tuple[tuple[Account, ...], Ticket]:
        """Split slots: charge the ticket's accounts (account.lua, one call per slot, at once);
        returns them and the ticket acquire.lua gets. A refusal on any of them refunds the
        others and raises, as acquire would have."""
        accounts, local = slot_accounts.split(ticket, prefix=self._prefix)
        if not accounts:
            return (), ticket
        expiry = now + max(1, round(ticket.queue_timeout_s * 1000)) + self.lease_ms
        replies = await asyncio.gather(
            *(
                self.pipe.script(
                    "account",
                    [account.slot],
                    slot_accounts.charge_args(
                        account,
                        now=now,
                        lease_id=lease_id,
                        max_concurrent=ticket.max_concurrent,
                        expiry_ms=expiry,
                    ),
                )
                for account in accounts
            ),
            return_exceptions=True,
        )
        counted = tuple(
            account
            for account, reply in zip(accounts, replies, strict=True)
            if not isinstance(reply, BaseException) and int(reply[0]) == 1
        )
        if len(counted) == len(accounts):
            return accounts, local
        self._refund_accounts(counted, lease_id)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        refusals: list[tuple[int, Limit | None, Any]] = []
        for account, reply in zip(accounts, replies, strict=True):
            status = int(reply[0])  # type: ignore[index]
            if status == -1:
                refusals.append((-1, None, reply))
            elif status == -4:
                index = int(reply[2]) - 1  # type: ignore[index]
                refusals.append((account.positions[index], account.limits[index], reply))
        _, limit, reply = min(refusals, key=lambda found: found[0])
        if limit is None:
            running = int(reply[2])
            raise MaxConcurrent(
                f"Use case {ticket.use_case_id} already has {running} requests waiting or "
                f"in flight, its maximum.",
                retry_after_s=retry_after_s(ahead=0, hold_ms=-1, in_flight=running, fallback_s=1.0),
            )
        raise RateLimited(limit, retry_after_ms=int(reply[3]))

    def _refund_accounts(self, accounts: Sequence[Account], lease_id: str) -> None:
        """Give back what the accounts were charged for a request no replica served."""
        now = self._clock()
        for account in accounts:
            args: list[Arg] = ["refund", now, lease_id, account.concurrency_key]
            self._send_nowait("account", account.slot, args, slot=True)

    def _send_nowait(self, name: str, model: str, args: list[Arg], *, slot: bool = False) -> None:
        """Run a script that must happen even though the caller is being cancelled; on
        ``model``'s pool, or (``slot``) on the slot whose prefix ``model`` is."""
        task = asyncio.ensure_future(self._send_logged(name, model, args, slot=slot))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _send_logged(
        self, name: str, model: str, args: list[Arg], *, slot: bool = False
    ) -> None:
        try:
            await self.pipe.script(name, [model] if slot else self._keys(model), args)
        except VALKEY_FAILURES as exc:
            # The lease expires and the waiter's deadline passes: the reaper cleans up.
            logger.warning("scheduler_%s_failed lease=%s error=%r", name, args[1], exc)

    async def _renew_forever(self) -> None:
        interval = self.lease_ms / 3000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.renew_held()
            except VALKEY_FAILURES as exc:
                logger.warning("scheduler_renew_failed error=%r", exc)

    async def _listen(self) -> None:
        pubsub = self._pubsub
        assert pubsub is not None
        while True:
            try:
                message = await pubsub.get_message(timeout=1.0)
            except VALKEY_FAILURES as exc:
                # Grants keep arriving through the fallback poll meanwhile.
                logger.warning("scheduler_listener_error error=%r", exc)
                await asyncio.sleep(0.1)
                continue
            if message is None or message.get("type") != "message":
                continue
            lease_id, _, replica = _text(message["data"]).partition(" ")
            future = self._waiting.get(lease_id)
            if future is not None and not future.done():
                future.set_result(replica)

    async def _reap_forever(self) -> None:
        """The heartbeat every ``_beat_s`` and a reaper pass every ``reap_interval_s``: one
        task per process for both."""
        loop = asyncio.get_running_loop()
        reap_at = loop.time() + self._reap_s
        while True:
            await asyncio.sleep(self._beat_s)
            try:
                await self.heartbeat()
            except VALKEY_FAILURES as exc:
                logger.warning("scheduler_heartbeat_failed error=%r", exc)
            except Exception:
                # A bug must not end the task: without heartbeats every pump passes this
                # gateway's waiters over, and without the reaper nobody's expired lease
                # comes back (an AttributeError at a Cluster failover once did both).
                logger.exception("scheduler_heartbeat_crashed")
            if loop.time() + self._beat_s / 2 < reap_at:  # timers may fire a little early
                continue
            reap_at = loop.time() + self._reap_s
            try:
                released, dropped, _ = await self.reap()
            except VALKEY_FAILURES as exc:
                logger.warning("scheduler_reap_failed error=%r", exc)
                continue
            except Exception:
                logger.exception("scheduler_reap_crashed")
                continue
            if released or dropped:
                logger.info("scheduler_reaped leases=%s waiters=%s", released, dropped)
