"""The async task API's two handlers on the gateway (docs/async.md, "The API").

- ``submit``: ``POST /v1/async/{embeddings,completions,chat/completions}``, one body or a
  JSON array of them. The same front door as the synchronous endpoint (gateway/front_door.py:
  authentication, body checks, model resolution, request guardrails); then submit.lua counts
  the rate limits, checks the backlog and queues every task, or refuses and writes nothing (on
  a Valkey Cluster the limits of other slots are charged first: queue.py). ``202`` with the
  tasks — once the replicas have them, when the gateway waits for replicas (acks.py).
- ``poll``: ``GET /v1/tasks/{id}[?wait=seconds]``: the task as its hash says, to its owner's
  use case only (anyone else: 404, as for an id that never existed).

The tasks are run by the batcher (scheduler/batcher/), which this module never imports: the
contract between them is gateway/async_tasks/layout.py.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs

import orjson

from gateway import errors
from gateway.admission.limits import Limit
from gateway.async_tasks import layout
from gateway.async_tasks.acks import ReplicaAcks
from gateway.async_tasks.bodies import TaskBody, at_index, parse_submission, read_task
from gateway.async_tasks.callback_urls import check_callback_urls
from gateway.async_tasks.documents import (
    fields_of,
    is_terminal,
    queued_document,
    task_document,
)
from gateway.async_tasks.queue import (
    BacklogFull,
    LimitPlans,
    NewTask,
    QueuedTask,
    TaskQueue,
    merged_limits,
)
from gateway.async_tasks.waiters import DoneWaiters
from gateway.autopipeline import auto_pipeline
from gateway.call import Call
from gateway.errors import GatewayError
from gateway.front_door import (
    BodyRefused,
    FrontDoor,
    admission_unavailable,
    authenticate,
    authenticate_after_key_fetch,
    check_request,
    check_requests,
    minted_id,
    plan_ticket,
    refusal,
)
from gateway.guardrail_plan import GuardPlan
from gateway.metrics import AsyncSubmitOutcome, AsyncWaitOutcome
from gateway.policy import Policy, Principal
from gateway.scheduling import RateLimited
from gateway.scheduling.tickets import priority_class_for
from runtime.http import ClientGone, Receive, Scope, Send, read_body, send_response
from runtime.valkey_urls import VALKEY_FAILURES

logger = logging.getLogger("gateway.async_tasks")

MAX_WAIT_S = 60.0
_TASK_ID = re.compile(r"^task_[0-9a-f]{32}$")


class AsyncTaskDoor:
    """One per gateway process, beside the synchronous path and sharing its front door
    (gateway/front_door.py): the policy, the autopipeline connection, the scheduler's clock,
    the guardrails, metrics."""

    def __init__(self, door: FrontDoor) -> None:
        self._door = door
        settings = door.settings
        self._settings = settings
        self._metrics = door.metrics
        self._plans = LimitPlans()
        self._pipe = door.scheduler.pipe
        self.queue = TaskQueue(
            door.scheduler.pipe,
            clock=door.scheduler.now_ms,
            max_backlog=settings.async_max_backlog,
            queue_ttl_s=settings.async_queue_ttl_s,
            partitions=settings.async_partitions,
            backlog_retry_after_s=settings.async_backlog_retry_after_s,
            # A Valkey Cluster: the limits of other slots are charged on them first.
            split_slots=door.scheduler.split_slots,
        )
        # A 202 tells a client its tasks are queued: with replicas to wait for, only once they
        # have them. WAIT blocks its connection: these waits get their own.
        self.acks = (
            ReplicaAcks(
                auto_pipeline(door.valkey),
                replicas=settings.usage_replicas,
                wait_ms=settings.usage_replica_timeout_ms,
                bound_ms=settings.async_replica_wait_ms,
            )
            if settings.usage_replicas
            else None
        )
        self.waiters = DoneWaiters(door.valkey)
        self._metrics.watch_long_polls(self.waiters.waiting)

    def start(self) -> None:
        self.waiters.start()

    async def close(self) -> None:
        await self.waiters.close()
        if self.acks is not None:
            await self.acks.close()

    # --- submit ----------------------------------------------------------------------------
    async def submit(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        door = self._door
        policy = door.policy.current()
        principal = authenticate(scope, policy, door.tokens)
        if principal is None:  # a token signed by a key not fetched yet
            principal = await authenticate_after_key_fetch(scope, policy, door.tokens)
        path = layout.ENDPOINTS[scope["path"]]
        body = await read_body(receive, self._settings.max_body_bytes)
        count = 1
        try:
            documents, bulk = parse_submission(body, max_bulk=self._settings.async_max_bulk)
            count = len(documents)
            tasks = self._read_tasks(path, documents, bulk, body, policy, principal)
            await check_callback_urls(
                tasks, bulk=bulk, allowed=self._settings.webhook_allowed_networks
            )
        except GatewayError:
            self._metrics.async_submitted("invalid", count)
            raise
        guard = policy.guarded.get(principal.use_case_id)
        if guard is not None and guard.request is not None:
            await self._check_requests(path, tasks, bulk, guard, policy, principal, request_id)
        queued = await self._queue(path, tasks, policy, principal)
        if self.acks is not None and not await self.acks.wait(layout.task(queued[0].id)):
            self._metrics.async_submitted("unavailable", count)
            raise _not_replicated(queued, self.acks.replicas)
        self._metrics.async_submitted("accepted", count)
        headers = [(b"x-request-id", request_id)]
        # A deprecated model's notices (once each, however many tasks name it).
        headers += dict.fromkeys(
            n for task in tasks if task.model.notices for n in task.model.notices
        )
        if bulk:
            reply: dict[str, Any] = {
                "object": "list",
                "data": [queued_document(task) for task in queued],
            }
        else:
            reply = queued_document(queued[0])
            headers.append((b"location", f"{layout.TASKS_PATH_PREFIX}{queued[0].id}".encode()))
        await send_response(send, 202, orjson.dumps(reply), headers=headers)

    def _read_tasks(
        self,
        path: str,
        documents: list[Any],
        bulk: bool,
        body: bytes,
        policy: Policy,
        principal: Principal,
    ) -> list[TaskBody]:
        now_s = time.time()
        if not bulk:  # the body is the one document: queued as sent unless it changes
            return [read_task(path, documents[0], body, policy, principal, now_s)]
        tasks = []
        for index, document in enumerate(documents):
            try:
                tasks.append(read_task(path, document, None, policy, principal, now_s))
            except GatewayError as exc:
                raise at_index(exc, index) from None
        return tasks

    async def _check_requests(
        self,
        path: str,
        tasks: list[TaskBody],
        bulk: bool,
        guard: GuardPlan,
        policy: Policy,
        principal: Principal,
        request_id: bytes,
    ) -> None:
        """The use case's request guardrails on every body, as the synchronous path runs
        them (gateway/front_door.py ``check_request``): a block refuses the whole call (400),
        a redaction rewrites the body that is queued, a flag is recorded. A bulk's bodies are
        checked as one batch (``check_requests``), not one after the other."""
        calls = [self._call(path, task, principal, request_id) for task in tasks]
        for call in calls:
            plan_ticket(self._door, call, policy)
        try:
            if bulk:
                await check_requests(self._door, calls, guard, policy)
            else:
                await check_request(self._door, calls[0], guard, policy)
        except BodyRefused as refused:
            self._metrics.async_submitted(_outcome(refused.error), len(tasks))
            raise at_index(refused.error, refused.index) from None
        except GatewayError as exc:
            self._metrics.async_submitted(_outcome(exc), len(tasks))
            raise
        for task in tasks:
            task.body = orjson.dumps(task.document)

    @staticmethod
    def _call(path: str, task: TaskBody, principal: Principal, request_id: bytes) -> Call:
        record_id = minted_id()
        return Call(
            request_id=request_id.decode(),
            request_id_bytes=request_id,
            record_id=record_id,
            record_id_bytes=record_id.encode(),
            principal=principal,
            model=task.model,
            path=path,
            body=task.body,
            document=task.document,
            form=None,
            content_type=b"application/json",
            streaming=False,
            estimate=task.estimate,
            # The queued body keeps the model as submitted (the batcher names the served
            # one): the check must not make the body the synchronous way.
            rename_per_replica=True,
        )

    async def _queue(
        self,
        path: str,
        tasks: list[TaskBody],
        policy: Policy,
        principal: Principal,
    ) -> list[QueuedTask]:
        new = [
            NewTask(
                model=task.model.public_id,
                endpoint=path,
                estimate=task.estimate.total,
                deadline_ms=task.deadline_ms,
                callback_url=task.callback_url,
                body=task.body,
            )
            for task in tasks
        ]
        packed: bytes | None = None
        if len(tasks) == 1 and not self.queue.split_slots:
            plan = self._plans.plan(policy, principal, new[0].model)
            limits: Sequence[Limit] = plan.limits
            packed = plan.packed(new[0].estimate)
        else:
            limits = merged_limits(
                [
                    self._plans.plan(policy, principal, task.model).charged(task.estimate)
                    for task in new
                ]
            )
        use_case = policy.use_cases.get(principal.use_case_id)
        try:
            return await self.queue.submit(
                new,
                limits,
                packed_limits=packed,
                use_case_id=principal.use_case_id,
                tenant=principal.tenant,
                priority_class=self._priority_class(policy, principal),
                result_ttl_s=use_case.async_result_ttl_s if use_case is not None else 600,
            )
        except RateLimited as refused:
            self._metrics.async_submitted("rate_limited", len(tasks))
            raise refusal(429, "rate_limit_error", refused, code="rate_limit_exceeded") from None
        except BacklogFull as full:
            self._metrics.async_submitted("backlog_full", len(tasks))
            raise errors.service_unavailable(
                str(full), code=full.code, retry_after_s=full.retry_after_s
            ) from None
        except VALKEY_FAILURES as exc:
            self._metrics.async_submitted("unavailable", len(tasks))
            raise admission_unavailable(exc) from None

    def _priority_class(self, policy: Policy, principal: Principal) -> str:
        """The async class when the policy has it: async work runs below interactive
        traffic. Else the principal's own (never above it)."""
        name = self._settings.async_priority_class
        if name in policy.priority_classes:
            return name
        return priority_class_for(policy, principal).name

    # --- poll ------------------------------------------------------------------------------
    async def poll(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> None:
        door = self._door
        policy = door.policy.current()
        principal = authenticate(scope, policy, door.tokens)
        if principal is None:
            principal = await authenticate_after_key_fetch(scope, policy, door.tokens)
        task_id: str = scope["path"][len(layout.TASKS_PATH_PREFIX) :]
        wait = _wait_seconds(scope.get("query_string", b""))
        fields = await self._read(task_id, principal) if _TASK_ID.match(task_id) else None
        if fields is not None and wait > 0 and not is_terminal(fields):
            fields = await self._wait(task_id, principal, wait, receive)
        self._metrics.async_polled(found=fields is not None, waited=wait > 0)
        if fields is None:
            # Also for another use case's task: its existence is not to be revealed.
            raise errors.not_found(f"No task '{task_id}'.", code="task_not_found")
        body = orjson.dumps(task_document(task_id, fields))
        await send_response(send, 200, body, headers=[(b"x-request-id", request_id)])

    async def _read(self, task_id: str, principal: Principal) -> dict[str, bytes] | None:
        """The task's hash if it exists and the caller's use case owns it."""
        try:
            reply = await self._pipe.execute("HGETALL", layout.task(task_id))
        except VALKEY_FAILURES as exc:
            logger.warning("async_tasks_unavailable error=%s", exc.__class__.__name__)
            raise errors.service_unavailable(
                "The task store is unavailable (the gateway cannot reach Valkey); retry shortly.",
                code="tasks_unavailable",
            ) from None
        fields = fields_of(reply)
        if not fields or fields.get("use_case_id") != str(principal.use_case_id).encode():
            return None
        return fields

    async def _wait(
        self, task_id: str, principal: Principal, wait: float, receive: Receive
    ) -> dict[str, bytes] | None:
        """Until the task ends or ``wait`` runs out; the hash as it stands then."""
        started = time.monotonic()
        done = self.waiters.register(task_id)
        outcome: AsyncWaitOutcome = "timeout"
        try:
            # Read again now that the end cannot pass unseen: it may have come just before.
            fields = await self._read(task_id, principal)
            if fields is None or is_terminal(fields):
                outcome = "done"
                return fields
            gone = asyncio.ensure_future(_disconnected(receive))
            try:
                await asyncio.wait((done, gone), timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
            if gone.done() and not gone.cancelled():
                outcome = "gone"
                raise ClientGone
            if done.done():
                outcome = "done"
            return await self._read(task_id, principal)
        finally:
            self.waiters.discard(task_id, done)
            self._metrics.async_waited(outcome, time.monotonic() - started)


def _not_replicated(queued: Sequence[QueuedTask], replicas: int) -> GatewayError:
    """The tasks are queued on the primary, but its replicas did not confirm them in time: a
    failover now could lose them. Not retried by the SDKs (a retry would queue them twice):
    the client polls the ids (404: lost, submit again) — docs/async.md."""
    ids = ", ".join(task.id for task in queued)
    refused = errors.service_unavailable(
        f"The tasks were queued but not yet copied to {replicas} Valkey replica(s), so a "
        f"failover could lose them: poll them before submitting again (404: lost). Tasks: {ids}.",
        code="async_not_replicated",
    )
    refused.headers.append((b"x-should-retry", b"false"))
    return refused


def _outcome(refused: GatewayError) -> AsyncSubmitOutcome:
    if refused.status == 429:
        return "rate_limited"
    if refused.status == 503:
        return "unavailable"
    return "blocked" if refused.code == "guardrail_blocked" else "invalid"


def _wait_seconds(query: bytes) -> float:
    if not query:
        return 0.0
    values = parse_qs(query.decode("latin-1")).get("wait")
    if not values:
        return 0.0
    try:
        seconds = float(values[-1])
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_WAIT_S:  # NaN fails too
        raise errors.bad_request(
            f"'wait' is a number of seconds from 0 to {MAX_WAIT_S:g}.", param="wait"
        )
    return seconds


async def _disconnected(receive: Receive) -> None:
    """Returns once the client has gone away."""
    while (await receive())["type"] != "http.disconnect":
        pass
