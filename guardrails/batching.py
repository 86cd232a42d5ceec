"""Micro-batching: concurrent check requests sent to one worker as one job.

Each request costs a worker a pipe round-trip and a wait in the queue for a free worker; under
load most of a check's latency is that wait. The batcher gathers the requests that arrive
within ``window_s`` of the first (wait-or-full: up to ``max_size``) into one job, so a worker
answers them all for one round-trip, and a detector that can score many texts in one call
(``check_many``, see guardrails/base.py ``BatchDetector``) does. A batch keeps taking in
requests while it waits for a free worker, so that under load batches grow by themselves and
a light load pays at most the window.

Any requests may share a batch: the job carries each request's own texts and checks (stage
only decides which checks a request may name, already validated), and the worker answers each
on its own, exactly as alone (``Engine.run_many``). What a batch shares is its fate: if no
worker is free within the queue timeout every request in it gets ``PoolBusy``; if it overruns
(the check timeout per request it holds) the worker is killed and replaced and every request
in it gets ``CheckTimeout``. ``window_s`` 0: no batching, one job per request.

Every request in a batch is answered when the whole batch is done, so batching only pays where
a check is cheap next to the per-request overhead (or a detector has ``check_many``); a batch
of checks that take hundreds of milliseconds each only makes its members wait for each other.
So the batcher learns what a request costs a worker (a moving average of a job's time over
its requests) and holds no more requests than fit in ``TARGET_BATCH_S`` of worker time (at
least one; ``max_size`` at most, and until it has measured anything).

A bulk (``run_bulk``: one call's many requests, guardrails/protocol.py ``/v1/check/bulk``) is
already a batch: it is cut into jobs of ``TARGET_BATCH_S`` of worker time by the same measure
(up to ``BULK_JOB_MAX`` requests; split evenly over the workers when smaller), which go to
the workers through one lane per worker, a lane's next job only once its last is answered: the
bulk keeps every worker busy, yet never holds more than one place in the queue for a worker a
lane, so the checks of other callers still get their turn and its own jobs do not wait out the
queue timeout behind each other. A job shares its fate as a batch does; the jobs of one bulk
do not.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from guardrails.workers import CheckFailed, Job, Outcome, WorkerPool

# The worker time a batch should take: a few lone checks' latency, far below a timeout.
TARGET_BATCH_S = 0.05
_SMOOTHING = 0.2  # weight of the newest job in the per-request cost's moving average
# The most requests of a bulk in one job, until the cost of one is known and after.
BULK_JOB_MAX = 64


@dataclass(eq=False)
class _Batch:
    members: list[tuple[Job, asyncio.Future[Outcome]]] = field(default_factory=list)
    full: asyncio.Event = field(default_factory=asyncio.Event)
    sealed: bool = False


class Batcher:
    def __init__(
        self,
        pool: WorkerPool,
        *,
        window_s: float,
        max_size: int,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        self._pool = pool
        self._window_s = window_s
        self._max_size = max(1, max_size)
        self._on_batch = on_batch
        self._open: _Batch | None = None  # the batch new requests join
        self._tasks: set[asyncio.Task[None]] = set()
        self._per_request_s: float | None = None  # a request's worker time, smoothed

    @property
    def cap(self) -> int:
        """The most requests a batch holds now: as many as fit in ``TARGET_BATCH_S``."""
        if self._per_request_s is None:
            return self._max_size
        fit = int(TARGET_BATCH_S / max(self._per_request_s, 1e-6))
        return max(1, min(self._max_size, fit))

    async def run(self, texts: list[str], checks: list[dict[str, Any]]) -> Outcome:
        """The outcome of this request's checks (``Outcome.as_json()``), or ``CheckFailed``."""
        if self._window_s <= 0:
            self._observe(1)
            return await self._pool.run(texts, checks)
        batch, cap = self._open, self.cap
        if batch is None or batch.sealed or len(batch.members) >= cap:
            batch = self._open = _Batch()
            task = asyncio.create_task(self._dispatch(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        answer: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        batch.members.append(((texts, checks), answer))
        if len(batch.members) >= cap:
            batch.full.set()
        # A caller that goes away cancels its own answer only: the batch runs for the others.
        return await answer

    async def run_bulk(self, jobs: Sequence[Job]) -> list[Outcome | CheckFailed]:
        """Each request's outcome, or the ``CheckFailed`` that is its answer, in order."""
        answers: list[Outcome | CheckFailed | None] = [None] * len(jobs)
        size = self._bulk_job_size(len(jobs))
        pending = iter(range(0, len(jobs), size))  # shared by the lanes: each takes the next
        loop = asyncio.get_running_loop()

        async def lane() -> None:
            for start in pending:
                part = jobs[start : start + size]
                self._observe(len(part))
                sent_at = loop.time()
                try:
                    results = await self._pool.run_many(part)
                except CheckFailed as exc:
                    results = [type(exc)(str(exc)) for _ in part]
                else:
                    self._learn((loop.time() - sent_at) / len(part))
                answers[start : start + len(part)] = results

        lanes = min(self._pool.size, -(-len(jobs) // size))
        await asyncio.gather(*(lane() for _ in range(lanes)))
        done = [answer for answer in answers if answer is not None]
        assert len(done) == len(jobs)
        return done

    def _bulk_job_size(self, requests: int) -> int:
        """Requests a bulk's job holds: ``TARGET_BATCH_S`` of worker time, but small enough
        to give every worker a share."""
        fit = BULK_JOB_MAX
        if self._per_request_s is not None:
            fit = int(TARGET_BATCH_S / max(self._per_request_s, 1e-6))
        share = -(-requests // self._pool.size)
        return max(1, min(BULK_JOB_MAX, fit, share))

    async def _dispatch(self, batch: _Batch) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._window_s):
                await batch.full.wait()

        loop = asyncio.get_running_loop()
        sent_at = 0.0

        def seal() -> list[Job]:
            nonlocal sent_at
            sent_at = loop.time()
            self._seal(batch)
            self._observe(len(batch.members))
            return [job for job, _ in batch.members]

        try:
            results = await self._pool.run_many(seal)
        except CheckFailed as exc:
            self._seal(batch)
            for _, answer in batch.members:
                if not answer.done():
                    answer.set_exception(type(exc)(str(exc)))
            return
        except BaseException:
            self._seal(batch)
            for _, answer in batch.members:
                if not answer.done():
                    answer.set_exception(CheckFailed("The guardrail service is stopping."))
            raise
        self._learn((loop.time() - sent_at) / len(batch.members))
        for (_, answer), result in zip(batch.members, results, strict=True):
            if answer.done():  # its caller went away
                continue
            if isinstance(result, CheckFailed):
                answer.set_exception(result)
            else:
                answer.set_result(result)

    def _learn(self, per_request_s: float) -> None:
        last = self._per_request_s
        self._per_request_s = (
            per_request_s if last is None else last + _SMOOTHING * (per_request_s - last)
        )

    def _seal(self, batch: _Batch) -> None:
        batch.sealed = True
        if self._open is batch:
            self._open = None

    def _observe(self, size: int) -> None:
        if self._on_batch is not None:
            self._on_batch(size)

    async def close(self) -> None:
        """Stop the batches waiting: their requests get ``CheckFailed``."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
