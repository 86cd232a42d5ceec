"""The batcher: consume the task streams, batch wait-or-full, run each batch through the
gateway's own admission and priority queue, and end every task per the contract.

One asyncio process; its loops:

- discover: the partitions registry, every ``discover_s`` (a new model's streams and group);
- read: XREADGROUP on every partition stream into per-(model, endpoint, class, compatibility)
  buffers; a buffer that reaches its batch size flushes at once;
- timer: flushes a buffer whose oldest task has waited its window (window.py);
- reclaim: XAUTOCLAIM of entries idle past ``claim_idle_ms`` (a dead batcher's), and a touch
  (XCLAIM JUSTID) of the entries this batcher holds, so that live work is never taken over;
- gauges and the drain rate.

A batch: expired tasks end ``expired`` unrun; the rest are marked running; tasks of a use
case the policy no longer approves (suspended or retired since submit) fail unrun (403);
cached results and identical deterministic payloads of one use case are answered once; the
distinct rest go upstream in one call (embeddings, completions) or concurrent calls (chat),
each call acquired from the Scheduler at the tasks' class and released after. A 5xx, a
timeout or no reachable replica is a failed attempt (retried with backoff; after
MAX_ATTEMPTS dead-lettered); a 4xx fails the task at once with the upstream's error.

Every answer then goes through the response stage the synchronous path uses
(gateway/response_stage.py): the use case's response guardrails (a block fails the task with
the guardrail's 422 error, a redaction rewrites the result) and its record policy (the usage
entry, and for ``full`` the transcript), under the task id as the record id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import valkey

from gateway import errors, model_routing
from gateway.accounting import Accounting, Usage
from gateway.async_tasks import layout
from gateway.autopipeline import auto_pipeline
from gateway.errors import GatewayError
from gateway.front_door import CAPABILITY
from gateway.guardrails.fleet import ask_logprobs_document
from gateway.guardrails.run import Guardrails
from gateway.model_lifecycle import serving_model
from gateway.policy import Model, Policy, Principal, PriorityClass
from gateway.policy_store import PolicyStore
from gateway.records import capped
from gateway.response_stage import Transcript, check_answer, keep_record
from gateway.scheduling import (
    MaxConcurrent,
    QueueFull,
    QueueTimeout,
    RateLimited,
    Scheduler,
    Ticket,
    saturated_entry,
    write_fleet,
)
from gateway.scheduling.keys import MAX_RANK
from gateway.scheduling.tickets import priority_class_named
from gateway.upstream import ReplicaUnreachable, Upstream, UpstreamError
from runtime.valkey_urls import VALKEY_FAILURES, async_client, is_cluster
from scheduler.batcher import payloads
from scheduler.batcher.callbacks import Callbacks
from scheduler.batcher.metrics import BatcherMetrics
from scheduler.batcher.payloads import MalformedTask, Task
from scheduler.batcher.settings import BatcherSettings
from scheduler.batcher.store import Ending, TaskStore, error_object
from scheduler.batcher.window import ArrivalRate, window_ms

_FAILED_OR_INVALID: tuple[type[BaseException], ...] = (*VALKEY_FAILURES, ValueError)

logger = logging.getLogger("scheduler.batcher")

READ_BLOCK_MS = 200  # XREADGROUP's block: how soon a stop or a new stream is seen
READ_COUNT = 1024
GAUGES_S = 2.0
DRAIN_REPORT_S = 0.5
BUFFER_IDLE_MS = 60_000
FORGET_AFTER_CLAIMS = 10  # a consumer idle this many claim timeouts, with nothing pending


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def now_ms() -> float:
    """Wall-clock milliseconds, as a float: comparable with the tasks' submit times."""
    return time.time() * 1000.0


class Retryable(Exception):
    """A failed attempt worth another: a 5xx, a timeout, no replica reachable."""

    def __init__(self, status: int, error: dict[str, Any], *, counts: bool = True) -> None:
        super().__init__(error.get("message", ""))
        self.status = status
        self.error = error
        # False: the fleet was busy (queue full or timed out), not failing: tried again
        # without counting an attempt (the task's deadline and TTL still bound it).
        self.counts = counts


# The error of an attempt whose batcher died (or whose batch crashed) before it ended.
INTERRUPTED = Retryable(
    500,
    error_object(
        "The task's attempts were interrupted (the batcher running it stopped).",
        code="batcher_interrupted",
    ),
)


@dataclass(slots=True)
class Outcome:
    """One upstream call's answer: a 2xx body, or a final error (a 4xx)."""

    status: int
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    replica: str | None = None
    queued_ms: float = 0.0
    upstream_ms: float = 0.0


@dataclass(slots=True)
class Answer:
    """A task's answer before the response stage: the result body (as the replica or the
    cache gave it) or, refused by the replica, ``outcome.error``."""

    task: Task
    outcome: Outcome
    body: bytes | None
    tokens: tuple[int, int]  # (prompt, completion) the answer says it used
    collapsed: bool = False
    served_by: Model | None = None  # a fallback model, when one served instead (issue 27)


@dataclass(slots=True)
class TaskSubject:
    """A task as the guardrails' findings name it (gateway.guardrails.run.Subject)."""

    request_id: str
    record_id: str
    principal: Principal
    model: Model


@dataclass(slots=True)
class Buffer:
    key: tuple[str, str, str, str]
    size: int
    tasks: list[Task] = field(default_factory=list)
    rate: ArrivalRate = field(default_factory=ArrivalRate)
    window_ms: float = 0.0  # the window as of the last arrival
    last_ms: float = 0.0  # the last arrival (wall clock): an empty buffer idle long is dropped


def use_case_of(task: Task) -> int:
    """The task's use case id (0 for one that is not a number: no use case has it)."""
    return int(task.use_case_id) if task.use_case_id.isdigit() else 0


def acting_as(task: Task, policy: Policy) -> Principal:
    """Whom a task acts as: its use case and tenant, no key (the task carries none)."""
    use_case_id = use_case_of(task)
    use_case = policy.use_cases.get(use_case_id)
    return Principal(
        key_id=None,
        key_prefix="",
        tenant=task.tenant,
        tenant_id=0,
        environment="",
        use_case=use_case.slug if use_case is not None else task.use_case_id,
        use_case_id=use_case_id,
        namespace="",
        models=frozenset(),
        expires_at=None,
    )


def _fallback_chain(policy: Policy, task: Task, model: Model) -> tuple[str, ...]:
    """The task's use case's fallbacks for the model it was queued for."""
    chains = policy.fallbacks.get(use_case_of(task))
    return chains.get(model.base, ()) if chains is not None else ()


def _fallback_model(policy: Policy, task: Task, name: str) -> Model | None:
    """The fallback ``name`` as it would serve the task (its version chosen), or None if it
    is not served or lacks the endpoint's capability. The snapshot's chains hold only models
    the use case may call (governance/snapshot.py): a task carries no key to check."""
    found = model_routing.named(policy, name)
    if found is None:
        return None
    if found.routing is not None:
        try:
            found = model_routing.route(policy, found, use_case_of(task))
        except GatewayError:
            return None
    capability = CAPABILITY.get(task.endpoint)  # the front door's table: one source
    return found if capability in found.capabilities else None


def service_class(policy: Policy, name: str) -> PriorityClass:
    """The task's class from the snapshot, or the unclassified one behind all the others."""
    return priority_class_named(policy, name)


def _tokens(body: bytes) -> tuple[int, int]:
    """(prompt, completion) tokens a result body says it used; none if it is not JSON."""
    try:
        result = orjson.loads(body)
    except orjson.JSONDecodeError:
        return 0, 0
    return payloads.tokens_of(result) if isinstance(result, dict) else (0, 0)


def _error_from(body: bytes, status: int) -> dict[str, Any]:
    """The upstream's OpenAI error object, or one made from its status."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        document = None
    if isinstance(document, dict):
        inner = document.get("error")
        if isinstance(inner, dict) and "message" in inner:
            return {
                "message": str(inner.get("message")),
                "type": str(inner.get("type") or "invalid_request_error"),
                "param": inner.get("param"),
                "code": inner.get("code"),
            }
        if "message" in document:  # vLLM's older flat shape
            return error_object(
                str(document["message"]), type=str(document.get("type") or "api_error")
            )
    kind = "invalid_request_error" if status < 500 else "api_error"
    return error_object(f"The replica answered {status}.", type=kind, code="upstream_error")


class Batcher:
    def __init__(self, settings: BatcherSettings, *, metrics: BatcherMetrics | None = None) -> None:
        self.settings = settings
        self.client = async_client(settings.fleet.valkey_url)
        self.store = TaskStore(self.client)
        self.policy = PolicyStore(
            self.client,
            refresh_s=settings.fleet.policy_refresh_s,
            max_staleness_s=settings.fleet.policy_max_staleness_s,
        )
        self.scheduler = Scheduler(
            self.client,
            pipe=auto_pipeline(self.client),  # one server, Sentinel or Cluster
            gateway_id=f"batcher-{self.store.consumer}",
            lease_ms=settings.fleet.lease_ms,
            heartbeat_ms=settings.fleet.heartbeat_ms,
            stale_ms=settings.fleet.stale_ms,
            waiting_threshold=settings.fleet.backpressure_waiting,
            long_prompt_tokens=settings.fleet.long_prompt_tokens,
            # A Valkey Cluster: each slot charged by its own script (docs/gateway-scheduling.md)
            split_slots=is_cluster(settings.fleet.valkey_url),
        )
        self.upstream = Upstream(
            connect_timeout_s=settings.fleet.upstream_connect_timeout_s,
            max_connections=settings.upstream_max_connections,
        )
        self.accounting = Accounting(
            self.client,
            pipe=self.scheduler.pipe,
            content_budget_bytes=settings.records.buffer_bytes,
        )
        self.metrics = metrics or BatcherMetrics()
        # The response stage's checks, as the gateway runs them (gateway/response_stage.py).
        self.guardrails = Guardrails.connect(
            settings.guardrails,
            upstream=self.upstream,
            policy=self.policy,
            scheduler=self.scheduler,
            metrics=self.metrics,
            accounting=self.accounting,
        )
        self.callbacks = Callbacks(settings.fleet.valkey_url)
        self.streams: list[str] = []
        self.buffers: dict[tuple[str, str, str, str], Buffer] = {}
        self.held: dict[str, set[str]] = {}  # stream → entry ids this batcher holds
        self._held_count = 0
        self._room = asyncio.Event()
        self._wake = asyncio.Event()
        self._batches: set[asyncio.Task[None]] = set()
        self._ended: dict[str, int] = {}  # model → tasks ended since the last drain report
        self._stopping = False
        self._loops: list[asyncio.Task[None]] = []

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        await self.upstream.start()
        await self.scheduler.start()
        await self.accounting.start()
        try:
            await self.policy.refresh()
        except _FAILED_OR_INVALID as exc:
            logger.warning("policy_initial_load_failed error=%r", exc)
        await self.discover()
        self._loops = [
            asyncio.create_task(self.policy.run(), name="batcher-policy"),
            asyncio.create_task(self._forever(self.discover, self.settings.discover_s)),
            asyncio.create_task(self._read_forever(), name="batcher-read"),
            asyncio.create_task(self._timer_forever(), name="batcher-timer"),
            asyncio.create_task(self._forever(self.reclaim, self._reclaim_every_s())),
            asyncio.create_task(self._forever(self.touch, self._reclaim_every_s())),
            asyncio.create_task(self._forever(self.gauges, GAUGES_S)),
            asyncio.create_task(self._forever(self.report_drain, DRAIN_REPORT_S)),
        ]
        logger.info(
            "batcher_started consumer=%s streams=%d max_batch=%d window_ms=%s",
            self.store.consumer,
            len(self.streams),
            self.settings.max_batch,
            self.settings.window_ms,
        )

    async def stop(self) -> None:
        """Stop reading; flush what is buffered and let the batches in flight end (bounded).
        Tasks waiting out a retry's backoff stay pending in the streams: another batcher
        reclaims them after claim_idle_ms."""
        self._stopping = True
        self.policy.stop()
        for loop in self._loops:
            loop.cancel()
        if self._loops:
            await asyncio.wait(self._loops, timeout=2.0)
        for buffer in list(self.buffers.values()):
            if buffer.tasks:
                self._flush(buffer, "stop")
        if self._batches:
            await asyncio.wait(self._batches, timeout=10.0)
        with contextlib.suppress(valkey.ValkeyError, OSError):
            await self.report_drain()
        await self.accounting.close()
        await self.scheduler.close()
        await self.upstream.close()
        await self.client.aclose()
        logger.info("batcher_stopped")

    def _reclaim_every_s(self) -> float:
        return max(min(self.settings.claim_idle_ms / 3000.0, 5.0), 0.05)

    async def _forever(self, work: Any, every_s: float) -> None:
        while not self._stopping:
            try:
                await work()
            except VALKEY_FAILURES as exc:
                logger.warning("batcher_loop_failed work=%s error=%r", work.__name__, exc)
            except Exception:
                logger.exception("batcher_loop_crashed work=%s", work.__name__)
            await asyncio.sleep(every_s)

    # --- consuming ----------------------------------------------------------------------
    async def discover(self) -> None:
        found = [stream for _, stream in await self.store.streams()]
        for stream in found:
            await self.store.ensure_group(stream)
        if found != self.streams:
            self.streams = found

    async def _read_forever(self) -> None:
        while not self._stopping:
            room = self.settings.max_held - self._held_count
            if room <= 0 or not self.streams:
                self._room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), READ_BLOCK_MS / 1000)
                continue
            try:
                entries = await self.store.read(
                    # COUNT applies per stream: what all of them may return stays in ``room``.
                    self.streams,
                    count=max(min(room, READ_COUNT) // len(self.streams), 1),
                    block_ms=READ_BLOCK_MS,
                )
            except VALKEY_FAILURES as exc:
                logger.warning("batcher_read_failed error=%r", exc)
                await asyncio.sleep(0.5)
                continue
            if entries:
                await self.take((stream, entry_id, fields) for stream, entry_id, fields in entries)

    async def reclaim(self) -> None:
        """Take over entries a dead batcher left pending."""
        for stream in list(self.streams):
            claimed = await self.store.reclaim(stream, min_idle_ms=self.settings.claim_idle_ms)
            if claimed:
                logger.info("batcher_reclaimed stream=%s entries=%d", stream, len(claimed))
                await self.take((stream, entry_id, fields) for entry_id, fields in claimed)
            # Consumers of batchers long gone, with nothing pending: every restart adds a
            # "<host>-<pid>", and the group would keep them for ever.
            await self.store.forget_consumers(
                stream, idle_ms=self.settings.claim_idle_ms * FORGET_AFTER_CLAIMS
            )

    async def touch(self) -> None:
        await self.store.touch({s: list(ids) for s, ids in self.held.items() if ids})

    async def take(self, entries: Iterable[tuple[str, str, dict[bytes, bytes]]]) -> None:
        """Entries into their buffers (those this batcher already holds are skipped)."""
        now = now_ms()
        bad: list[Ending] = []
        for stream, entry_id, fields in entries:
            ids = self.held.setdefault(stream, set())
            if entry_id in ids:
                continue
            try:
                task = payloads.parse_entry(stream, entry_id, fields)
            except MalformedTask as exc:
                if exc.task is None:  # not even a task id: nothing to end, nobody to tell
                    await self.client.xack(stream, layout.GROUP, entry_id)
                    await self.client.xdel(stream, entry_id)
                    continue
                self._hold(exc.task)
                bad.append(self._failed(exc.task, 400, error_object(
                    str(exc), type="invalid_request_error", code="invalid_task"
                )))  # fmt: skip
                continue
            task.read_ms = now
            self._hold(task)
            self._buffer(task)
        if bad:
            await self._end(bad)

    def _hold(self, task: Task) -> None:
        self.held.setdefault(task.stream, set()).add(task.entry_id)
        self._held_count += 1

    def _release(self, task: Task) -> None:
        ids = self.held.get(task.stream)
        if ids is not None and task.entry_id in ids:
            ids.discard(task.entry_id)
            self._held_count -= 1
            self._room.set()

    def _buffer(self, task: Task) -> None:
        buffer = self.buffers.get(task.buffer_key)
        if buffer is None:
            size = self.settings.batch_size(task.model)
            buffer = self.buffers[task.buffer_key] = Buffer(task.buffer_key, size)
        buffer.tasks.append(task)
        buffer.last_ms = now_ms()
        task.buffered = True
        buffer.rate.arrived(float(task.created_ms))
        if len(buffer.tasks) >= buffer.size:
            self._flush(buffer, "full")
        else:
            buffer.window_ms = self._window(buffer)
            self._wake.set()

    def _window(self, buffer: Buffer) -> float:
        s = self.settings
        return window_ms(
            buffer.rate.per_second(float(wall_ms())),
            buffer.size - len(buffer.tasks),
            base_ms=s.window_ms,
            min_ms=s.min_window_ms,
            max_ms=s.max_window_ms,
        )

    async def _timer_forever(self) -> None:
        while not self._stopping:
            now = now_ms()
            next_due = float("inf")
            for buffer in list(self.buffers.values()):
                if not buffer.tasks:
                    # Kept while traffic may come back (its arrival rate is what the next
                    # window is made from); dropped once idle, so that one-off parameter
                    # sets do not pile up.
                    if now - buffer.last_ms > BUFFER_IDLE_MS:
                        del self.buffers[buffer.key]
                    continue
                if self._due(buffer) <= now:
                    self._flush(buffer, "window")
                if buffer.tasks:  # not due yet, or what a window flush left
                    next_due = min(next_due, self._due(buffer))
            self._wake.clear()
            # Woken by arrivals, by the next window, and now and then to drop idle buffers.
            timeout = (min(next_due - now, BUFFER_IDLE_MS)) / 1000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _due(self, buffer: Buffer) -> float:
        """When the buffer flushes unless it fills first: its oldest task has waited the
        window since it was submitted — but at least the minimum window since this batcher
        read it, so that a backlog read in bursts still fills its batches."""
        oldest = buffer.tasks[0]
        return max(
            oldest.created_ms + buffer.window_ms, oldest.read_ms + self.settings.min_window_ms
        )

    def _flush(self, buffer: Buffer, reason: str) -> None:
        while buffer.tasks:
            tasks, buffer.tasks = buffer.tasks[: buffer.size], buffer.tasks[buffer.size :]
            for task in tasks:
                task.buffered = False
            model = buffer.key[0]
            self.metrics.flushes.labels(model, reason).inc()
            self.metrics.batch_size.labels(model).observe(len(tasks))
            self.metrics.fill_ratio.labels(model).observe(len(tasks) / buffer.size)
            self.metrics.window.labels(model).observe(buffer.window_ms / 1000)
            now = now_ms()
            for task in tasks:
                self.metrics.wait.labels(model).observe(max(now - task.read_ms, 0) / 1000)
            batch = asyncio.create_task(self._run_batch(tasks))
            self._batches.add(batch)
            batch.add_done_callback(self._batches.discard)
            if reason == "window":
                break  # the rest (if any) waits a window of its own

    # --- a batch ------------------------------------------------------------------------
    async def _run_batch(self, tasks: list[Task]) -> None:
        try:
            await self._run(tasks)
        except VALKEY_FAILURES as exc:
            # Nothing ended: the entries stay pending here; they are tried again after a
            # backoff, or reclaimed by another batcher if this one dies.
            logger.warning("batch_valkey_failed tasks=%d error=%r", len(tasks), exc)
            self._retry_later(tasks, 1)
        except Exception:
            logger.exception("batch_crashed tasks=%d", len(tasks))
            self._retry_later(tasks, 1)

    async def _run(self, tasks: list[Task]) -> None:
        now = wall_ms()
        endings: list[Ending] = []
        live: list[Task] = []
        for task in tasks:
            if task.past_due(now):
                endings.append(self._expired(task, now))
            else:
                live.append(task)
        try:
            policy = self.policy.current()
        except GatewayError:
            await self._end(endings)
            self._retry_later(live, 1)
            return
        if live:
            started = await self.store.start(live, now)
            running: list[Task] = []
            for task, (status, attempts) in zip(live, started, strict=True):
                task.attempts = attempts
                if status == "gone" or status in layout.TERMINAL:
                    # A duplicate delivery of an ended task, or a task whose hash expired:
                    # acknowledge it, run nothing.
                    endings.append(Ending(task, {}))
                elif status == "running" and attempts >= layout.MAX_ATTEMPTS:
                    # Its attempts died with their batchers (start.lua counted them).
                    endings.append(self._dead_letter(task, INTERRUPTED, attempts))
                elif not policy.use_case_active(use_case_of(task)):
                    # Suspended or retired since it was submitted: what its use case may
                    # no longer do is not done (the gateway refuses its keys alike).
                    refused = errors.use_case_not_approved(task.use_case_id)
                    endings.append(self._failed(task, refused.status, refused.error()))
                    logger.info(
                        "task_refused task=%s use_case=%s reason=use_case_not_approved",
                        task.task_id,
                        task.use_case_id,
                    )
                else:
                    running.append(task)
            live = running
        model = model_routing.named(policy, live[0].model) if live else None
        if live and model is None and "@" in live[0].model:
            # Queued for a version (the front door chose it) that is no longer deployed:
            # the model's routing chooses again rather than failing the task.
            parent = policy.models.get(live[0].model.partition("@")[0])
            model = parent if parent is not None and parent.routing is not None else None
        if live and model is None:
            error = error_object(
                f"The model '{live[0].model}' is not served any more.",
                type="invalid_request_error",
                code="model_not_found",
            )
            endings += [self._failed(t, 404, error) for t in live]
            live = []
        if live and model is not None and model.lifecycle is not None:
            # Queued before its model's sunset, run after it: the same rule as at admission
            # (a 410 naming the successor, or the successor serving under the old id).
            try:
                model = serving_model(policy, model, live[0].model)
            except GatewayError as refused:
                endings += [self._failed(t, refused.status, refused.error()) for t in live]
                live = []
        if live and model is not None and model.routing is not None:
            # A model with versions: each task goes where the front door would have sent
            # it (its use case's pin, else the split), one call per version.
            versions: dict[str, tuple[Model, list[Task]]] = {}
            for task in live:
                try:
                    version = model_routing.route(policy, model, use_case_of(task))
                except GatewayError as refused:
                    endings.append(self._failed(task, refused.status, refused.error()))
                    continue
                versions.setdefault(version.public_id, (version, []))[1].append(task)
            for version, tasks in versions.values():
                endings += await self._answer(tasks, version, policy)
        elif live:
            assert model is not None
            endings += await self._answer(live, model, policy)
        await self._end(endings)

    async def _answer(self, tasks: list[Task], model: Model, policy: Policy) -> list[Ending]:
        """Cache, collapse, call, then the response stage; the endings of every task
        (retries are scheduled here)."""
        endings: list[Ending] = []
        answers: list[Answer] = []
        cache_s: dict[str, int] = {}
        for task in tasks:
            use_case = policy.use_cases.get(use_case_of(task))
            cache_s[task.task_id] = use_case.async_cache_s if use_case is not None else 0
        cacheable = [t for t in tasks if t.deterministic and cache_s[t.task_id] > 0]
        hits = await self.store.cached(
            [layout.result_cache(t.use_case_id, t.payload_sha) for t in cacheable]
        )
        hit_ids: set[str] = set()
        for task, body in zip(cacheable, hits, strict=True):
            if body is not None:
                hit_ids.add(task.task_id)
                answers.append(Answer(task, Outcome(200), body, _tokens(body), collapsed=True))
                self.metrics.collapsed.labels(task.model, "cache").inc()
        # Identical payloads collapse within a use case only: the hash includes it.
        groups: dict[str, list[Task]] = {}
        for task in tasks:
            if task.task_id in hit_ids:
                continue
            groups.setdefault(task.payload_sha if task.deterministic else task.task_id, []).append(
                task
            )
        if groups:
            representatives = [group[0] for group in groups.values()]
            wait = self._degraded_wait(representatives, model, policy)
            outcomes = await self._call(representatives, model, policy, wait=wait)
            served = await self._fall_back(representatives, outcomes, model, policy)
            to_cache: list[tuple[str, bytes, int]] = []
            for group, outcome, by in zip(groups.values(), outcomes, served, strict=True):
                if isinstance(outcome, Retryable):
                    endings += await self._attempt_failed(group, outcome)
                    continue
                if outcome.result is None:
                    assert outcome.error is not None
                    answers += [Answer(task, outcome, None, (0, 0), served_by=by) for task in group]
                    continue
                shared = len(group) > 1
                if shared:
                    self.metrics.collapsed.labels(group[0].model, "batch").inc(len(group) - 1)
                body = orjson.dumps(outcome.result)
                # Each copy is billed what its answer says it used: one computation served
                # them, but each task of the use case asked for (and got) the whole answer.
                tokens = payloads.tokens_of(outcome.result)
                answers += [
                    Answer(task, outcome, body, tokens, collapsed=shared, served_by=by)
                    for task in group
                ]
                if outcome.status == 200 and by is None:  # a fallback's answer is not cached
                    # The answer as the replica gave it: the response stage runs again on
                    # each task it answers, under the policy of that day.
                    head = group[0]
                    seconds = cache_s[head.task_id]
                    if head.deterministic and seconds > 0:
                        to_cache.append(
                            (layout.result_cache(head.use_case_id, head.payload_sha), body, seconds)
                        )
            with contextlib.suppress(valkey.ValkeyError, OSError):
                await self.store.cache(to_cache)
        at_ms = wall_ms()
        endings += await asyncio.gather(*(self._deliver(a, model, policy, at_ms) for a in answers))
        return endings

    async def _deliver(self, answer: Answer, model: Model, policy: Policy, at_ms: int) -> Ending:
        """A task's answer as the synchronous path answers a request, through the same code
        (gateway/response_stage.py): the use case's response guardrails on a result (blocked:
        the task fails with the guardrail's 422 error; redacted: the result is rewritten),
        then its record policy — the usage entry, and for ``full`` the transcript of the
        request as forwarded and the answer as the client reads it."""
        task, outcome = answer.task, answer.outcome
        model = answer.served_by or model
        use_case_id = use_case_of(task)
        status, body, error = outcome.status, answer.body, outcome.error
        guard = policy.guarded.get(use_case_id)
        if body is not None and guard is not None and guard.response is not None:
            subject = TaskSubject(task.task_id, task.task_id, acting_as(task, policy), model)
            try:
                body = await check_answer(
                    self.guardrails,
                    subject,
                    path=task.endpoint,
                    guard=guard,
                    body=body,
                    document=task.body,
                    policy_version=policy.version,
                )
            except GatewayError as refused:
                status, body, error = refused.status, None, refused.error()
        if body is not None:
            ending = self._done(task, body, collapsed=answer.collapsed, status=status)
            sent = body
        else:
            assert error is not None
            ending = self._failed(task, status, error)
            sent = orjson.dumps({"error": error})  # what the sync path answers and records
        record = policy.record_policy(use_case_id)
        usage = Usage(
            request_id=task.task_id,
            at_ms=at_ms,
            tenant=task.tenant,
            use_case_id=use_case_id,
            key_id=None,
            model=model.public_id,  # what served: a successor past its predecessor's sunset
            replica=outcome.replica,
            status=status,
            prompt_tokens=answer.tokens[0],
            completion_tokens=answer.tokens[1],
            queued_ms=outcome.queued_ms,
            upstream_ms=outcome.upstream_ms,
            total_ms=float(max(at_ms - task.created_ms, 0)),
            policy_version=policy.version,
            # The task id: random, what the client already holds, and the same however often
            # the task is delivered (a redelivery's record replaces, never doubles).
            record_id=task.task_id,
            endpoint=task.endpoint,
            record=record,
        )
        transcript = self._transcript(task, model, outcome, sent) if record == "full" else None
        keep_record(self.accounting, usage, transcript)
        return ending

    def _transcript(self, task: Task, model: Model, outcome: Outcome, sent: bytes) -> Transcript:
        """A full record's content: the task's own request as a replica got it (the served
        name, the completion bound; not the priority, nor the batch it shared a call with)
        and the answer as its owner reads it."""
        served = model.served_name_for(outcome.replica) if outcome.replica else model.served_name
        forwarded = payloads.upstream_document(task, served, model.max_tokens)
        limit = self.settings.records.max_content_bytes
        request, request_cut = capped(orjson.dumps(forwarded), limit)
        response, response_cut = capped(sent, limit)
        return Transcript(request, response, b"application/json", request_cut or response_cut)

    def _degraded_wait(self, tasks: list[Task], model: Model, policy: Policy) -> float | None:
        """The class's ``degrade_after_s`` when every task has a fallback for ``model``: how
        long the call waits on a saturated pool before the fallback is asked."""
        klass = service_class(policy, tasks[0].priority_class)
        if klass.degrade_after_s is None or not all(
            _fallback_chain(policy, task, model) for task in tasks
        ):
            return None
        return max(klass.degrade_after_s, 0.001)

    async def _fall_back(
        self,
        tasks: list[Task],
        outcomes: list[Outcome | Retryable],
        model: Model,
        policy: Policy,
    ) -> list[Model | None]:
        """Where ``model`` refused a task for capacity (its queue, a 5xx, no replica) and the
        task's use case has fallbacks for it, the first fallback that answers serves it, as
        at the front door (gateway/fallbacks.py); ``outcomes`` updated in place. Which model
        served each task: None for ``model``."""
        served: list[Model | None] = [None] * len(tasks)

        async def one(i: int, task: Task) -> None:
            for name in _fallback_chain(policy, task, model):
                fallback = _fallback_model(policy, task, name)
                if fallback is None:
                    continue
                [outcome] = await self._call([task], fallback, policy)
                self.metrics.fallbacks.labels(model.public_id, fallback.public_id).inc()
                if not isinstance(outcome, Retryable):
                    outcomes[i], served[i] = outcome, fallback
                    return

        await asyncio.gather(
            *(
                one(i, task)
                for i, (task, outcome) in enumerate(zip(tasks, outcomes, strict=True))
                if isinstance(outcome, Retryable) and (not outcome.counts or outcome.status >= 500)
            )
        )
        return served

    async def _call(
        self, tasks: list[Task], model: Model, policy: Policy, *, wait: float | None = None
    ) -> list[Outcome | Retryable]:
        """Each task's outcome: one call for a batchable endpoint, else one call each.
        ``wait``: the most the call waits in the pool's queue, if less than its class's."""
        endpoint = tasks[0].endpoint
        klass = service_class(policy, tasks[0].priority_class)
        if wait is not None and wait < klass.queue_timeout_s:
            klass = replace(klass, queue_timeout_s=wait)
        if endpoint in payloads.INPUT_MEMBER:
            call = payloads.batch_call(tasks, model.served_name, model.max_tokens)
            cost = sum(t.estimate for t in tasks)
            try:
                outcome = await self._post(tasks[0], model, klass, endpoint, call.body, cost)
            except Retryable as failed:
                return [failed] * len(tasks)
            if outcome.result is None:
                if len(tasks) == 1:
                    return [outcome]
                # Refused as a whole: which task's input was it? Each on its own, so that one
                # bad input (too long for the context, say) fails only its own task.
                self.metrics.upstream_calls.labels(model.public_id, endpoint, "split").inc()
                alone = await asyncio.gather(*(self._call([t], model, policy) for t in tasks))
                return [outcomes[0] for outcomes in alone]
            sliced = payloads.slice_results(endpoint, outcome.result, call)
            return [
                Outcome(outcome.status, result, None, outcome.replica, outcome.queued_ms,
                        outcome.upstream_ms)
                for result in sliced
            ]  # fmt: skip

        async def one(task: Task) -> Outcome | Retryable:
            document = payloads.upstream_document(task, model.served_name, model.max_tokens)
            guard = policy.guarded.get(use_case_of(task))
            if guard is not None and guard.logprobs:
                # A response check reads the answer's token logprobs (groundedness by
                # logprobs); check_answer takes them out again unless the task asked.
                document = ask_logprobs_document(endpoint, document)
            try:
                return await self._post(task, model, klass, endpoint, document, task.estimate)
            except Retryable as failed:
                return failed

        return list(await asyncio.gather(*(one(t) for t in tasks)))

    async def _post(
        self,
        head: Task,
        model: Model,
        klass: PriorityClass,
        endpoint: str,
        document: dict[str, Any],
        cost: int,
    ) -> Outcome:
        """One upstream call through the scheduler: acquire at the class (no limits: they
        were counted at submit), relay to the granted replica, release; an unreachable
        replica is refunded and another tried. Raises Retryable."""
        ticket = Ticket(
            request_id=head.task_id,
            model=model.public_id,
            replicas=tuple((url, model.max_in_flight_per_replica) for url in model.replicas),
            rank=min(klass.rank, MAX_RANK),
            priority_class=klass.name,
            queue_timeout_s=max(klass.queue_timeout_s, 0.001),
            max_queue_length=klass.max_queue_length,
            tenant=head.tenant,
            use_case_id=int(head.use_case_id) if head.use_case_id.isdigit() else head.use_case_id,
            cost=max(cost, 1),
            vllm_priority=klass.vllm_priority,
            pool_share=klass.pool_share_permille,
            # The stream keeps only the whole estimate: a batch prefills its prompts together,
            # so all of it counts as prompt for the pool's lanes (docs/async.md).
            prompt_tokens=max(cost, 1),
        )
        for _ in range(max(len(model.replicas), 1)):
            try:
                grant = await self.scheduler.acquire(ticket)
            except (QueueFull, QueueTimeout, RateLimited, MaxConcurrent) as refused:
                self.metrics.upstream_calls.labels(model.public_id, endpoint, "refused").inc()
                raise Retryable(
                    503,
                    error_object(str(refused), type="service_unavailable", code=refused.code),
                    counts=False,
                ) from None
            started = time.monotonic()
            try:
                async with self.scheduler.keep_alive(
                    grant, wait_for_release=False, refund_on=(ReplicaUnreachable,)
                ):
                    document["model"] = model.served_name_for(grant.replica)
                    document["priority"] = grant.vllm_priority
                    body = orjson.dumps(document)
                    headers = (
                        (b"content-type", b"application/json"),
                        (b"x-request-id", grant.lease_id.encode()),
                    )
                    status, answer = await self._exchange(
                        grant.replica, endpoint, body, headers, model
                    )
            except ReplicaUnreachable as exc:
                self.metrics.upstream_calls.labels(model.public_id, endpoint, "unreachable").inc()
                with contextlib.suppress(valkey.ValkeyError, OSError):
                    await write_fleet(
                        self.client,
                        model.public_id,
                        {exc.replica: saturated_entry(scraped_at_ms=self.scheduler.now_ms())},
                    )
                continue
            upstream_ms = (time.monotonic() - started) * 1000
            outcome = Outcome(status, None, None, grant.replica, grant.queued_ms, upstream_ms)
            if 200 <= status < 300:
                try:
                    parsed = orjson.loads(answer)
                except orjson.JSONDecodeError:
                    parsed = None
                if isinstance(parsed, dict):
                    self.metrics.upstream_calls.labels(model.public_id, endpoint, "ok").inc()
                    outcome.result = parsed
                    return outcome
                status = 502
            error = _error_from(answer, status)
            if status >= 500 or status == 429:
                self.metrics.upstream_calls.labels(model.public_id, endpoint, "error").inc()
                raise Retryable(status, error)
            self.metrics.upstream_calls.labels(model.public_id, endpoint, "refused_4xx").inc()
            outcome.error = error
            return outcome
        raise Retryable(
            502,
            error_object(
                f"No replica of model '{model.public_id}' could be reached.",
                code="upstream_unavailable",
            ),
        )

    async def _exchange(
        self, replica: str, endpoint: str, body: bytes, headers: Any, model: Model
    ) -> tuple[int, bytes]:
        """POST and read the whole answer within the model's timeout."""
        try:
            async with asyncio.timeout(model.timeout_s):
                response = await self.upstream.post(replica, endpoint, body, headers)
                try:
                    chunks = []
                    while chunk := await response.read():
                        chunks.append(chunk)
                    return response.status, b"".join(chunks)
                finally:
                    response.close()
        except ReplicaUnreachable:
            raise
        except TimeoutError:
            self.metrics.upstream_calls.labels(model.public_id, endpoint, "timeout").inc()
            raise Retryable(
                504,
                error_object(
                    f"Model '{model.public_id}' did not answer within {model.timeout_s:g}s.",
                    type="timeout_error",
                    code="upstream_timeout",
                ),
            ) from None
        except UpstreamError as exc:
            self.metrics.upstream_calls.labels(model.public_id, endpoint, "broken").inc()
            raise Retryable(
                502,
                error_object(
                    f"The replica serving '{model.public_id}' failed: {exc.__class__.__name__}.",
                    code="upstream_error",
                ),
            ) from None

    # --- endings ------------------------------------------------------------------------
    async def _attempt_failed(self, tasks: list[Task], failed: Retryable) -> list[Ending]:
        """A failed attempt for each task: tried again after a backoff, or dead-lettered."""
        endings: list[Ending] = []
        later: list[Task] = []
        for task in tasks:
            if not failed.counts:
                later.append(task)
                continue
            attempts = await self.store.attempt_failed(task, failed.error)
            if attempts < 0:
                endings.append(Ending(task, {}))  # gone or ended meanwhile: acknowledge
            elif attempts >= layout.MAX_ATTEMPTS:
                endings.append(self._dead_letter(task, failed, attempts))
            else:
                task.attempts = attempts
                later.append(task)
                self.metrics.retries.labels(task.model).inc()
        if later:
            logger.info(
                "batch_attempt_failed tasks=%d status=%s code=%s",
                len(later),
                failed.status,
                failed.error.get("code"),
            )
            self._retry_later(later, max((t.attempts for t in later), default=1))
        return endings

    def _retry_later(self, tasks: list[Task], attempts: int) -> None:
        """Back into their buffers after base · 2^(attempts-1) ms; still pending here."""
        if not tasks or self._stopping:
            return
        delay_s = self.settings.retry_backoff_ms * (2 ** max(attempts - 1, 0)) / 1000

        def again() -> None:
            now = now_ms()
            for task in tasks:
                # Only tasks still held and not already waiting in a buffer (a batch that
                # failed after scheduling some of its tasks' retries must not double them).
                if task.buffered or task.entry_id not in self.held.get(task.stream, ()):
                    continue
                task.read_ms = now
                self._buffer(task)

        asyncio.get_running_loop().call_later(delay_s, again)

    def _done(self, task: Task, body: bytes, *, collapsed: bool, status: int = 200) -> Ending:
        fields: dict[str, str | int] = {
            "status": "done",
            "result": body.decode(),
            "status_code": status,
            "finished_ms": wall_ms(),
        }
        if collapsed:
            fields["collapsed"] = "1"
        return Ending(task, fields)

    def _failed(self, task: Task, status: int, error: dict[str, Any]) -> Ending:
        return Ending(
            task,
            {
                "status": "failed",
                "error": orjson.dumps(error).decode(),
                "status_code": status,
                "finished_ms": wall_ms(),
            },
        )

    def _expired(self, task: Task, now: int) -> Ending:
        why = "deadline" if 0 < task.deadline_ms <= now else "queue time limit"
        error = error_object(
            f"The task passed its {why} before it could run; it was not run.",
            type="invalid_request_error",
            code="task_expired",
        )
        return Ending(
            task,
            {"status": "expired", "error": orjson.dumps(error).decode(), "finished_ms": now},
        )

    def _dead_letter(self, task: Task, failed: Retryable, attempts: int) -> Ending:
        ending = self._failed(task, failed.status, failed.error)
        ending.fields["dead_lettered"] = "1"
        ending.dead_letter = {
            **{name: task.fields.get(name, "") for name in layout.ENTRY_FIELDS},
            "error": orjson.dumps(failed.error).decode(),
            "attempts": str(attempts),
            "failed_ms": str(wall_ms()),
            "stream": task.stream,
        }
        return ending

    async def _end(self, endings: list[Ending]) -> None:
        if not endings:
            return
        ended = await self.store.end(endings)
        for ending, did in zip(endings, ended, strict=True):
            task = ending.task
            self._release(task)
            if did:
                state = str(ending.fields.get("status", ""))
                self.metrics.ended.labels(task.model, state).inc()
                self._ended[task.model] = self._ended.get(task.model, 0) + 1
                if task.callback_url:
                    self.callbacks.send(task, ending.fields)

    # --- reporting ----------------------------------------------------------------------
    async def report_drain(self) -> None:
        ended, self._ended = self._ended, {}
        now = wall_ms()
        for model, count in ended.items():
            await self.store.drained(model, count, now)

    async def gauges(self) -> None:
        now = wall_ms()
        async with self.client.pipeline(transaction=False) as pipe:
            for stream in self.streams:
                pipe.xlen(stream)
                pipe.xrange(stream, count=1)
            pipe.xlen(layout.dead_letters())
            replies = await pipe.execute()
        for index, stream in enumerate(self.streams):
            length, first = replies[2 * index], replies[2 * index + 1]
            self.metrics.depth.labels(stream).set(int(length))
            age = 0.0
            if first:
                entry_id = first[0][0]
                entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                age = max(now - int(entry_id.split("-")[0]), 0) / 1000
            self.metrics.oldest_age.labels(stream).set(age)
        self.metrics.dlq_size.set(int(replies[-1]))
