"""A pool of worker processes, each holding one loaded ``Engine``, driven from an event loop.

Why not ``concurrent.futures.ProcessPoolExecutor``: a detector stuck past the check timeout
must be killed and replaced on its own, and an executor can neither kill one worker nor
survive one dying (it breaks the whole pool). Here each worker is a process with a pipe; the
loop sends it a job and awaits its reply on the pipe's file descriptor, so nothing blocks;
a worker that overruns is killed (SIGKILL), a fresh one loads its models in the background
and joins the pool when ready, and the caller gets ``CheckTimeout`` at once.

A job is a list of requests (``Job``: texts and checks each), one or a batch
(guardrails/batching.py); the worker answers each request on its own (``Engine.run_many``),
but the job shares one fate: it has ``check_timeout_s`` per request, and past that the worker
is killed and every request in it gets ``CheckTimeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

logger = logging.getLogger("guardrails.workers")

Job = tuple[list[str], list[dict[str, Any]]]  # one request: texts, checks (CheckSpec.as_json())
Outcome = dict[str, Any]  # Outcome.as_json()


class CheckFailed(Exception):
    """The check could not run; ``code`` says how (the protocol's error code)."""

    code = "guardrail_failed"


class CheckTimeout(CheckFailed):
    code = "guardrail_timeout"


class PoolBusy(CheckFailed):
    code = "guardrail_busy"


def _worker_main(conn: Connection, preload: list[str]) -> None:
    """One worker process: load the detectors once, then run jobs until told to stop. A job
    is a list of requests; the answer has one ``("ok", outcome)`` or ``("error", class)``
    per request, in order."""
    # The service handles Ctrl-C and SIGTERM and stops its workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from guardrails.engine import Check, Engine

    engine = Engine([])
    for name in preload:
        try:
            engine.detector(name)
        except Exception as exc:
            # A detector that cannot load (a missing optional package) must not take the
            # others down: checks naming it fail, the rest run.
            logging.getLogger("guardrails.workers").warning(
                "detector_load_failed guardrail=%s error=%r", name, exc
            )
    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        try:
            results = engine.run_many(
                [
                    (texts, [Check(c["guardrail"], c["action"], c["settings"]) for c in checks])
                    for texts, checks in job
                ]
            )
        except Exception as exc:
            # The class only: a detector's message may quote the text it was checking.
            conn.send(("error", exc.__class__.__name__))
            continue
        conn.send(
            (
                "ok",
                [
                    ("error", result.__class__.__name__)
                    if isinstance(result, Exception)
                    else ("ok", result.as_json())
                    for result in results
                ],
            )
        )


@dataclass(eq=False)
class _Worker:
    process: BaseProcess
    conn: Connection


async def _readable(conn: Connection) -> None:
    """Wait, without blocking the loop, until ``conn`` has something to read (or closed)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = conn.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


class WorkerPool:
    def __init__(
        self,
        *,
        size: int,
        preload: Sequence[str],
        check_timeout_s: float,
        queue_timeout_s: float,
        on_replaced: Callable[[str], None] | None = None,
    ) -> None:
        self.size = size
        self._preload = list(preload)
        self._check_timeout_s = check_timeout_s
        self._queue_timeout_s = queue_timeout_s
        self._on_replaced = on_replaced
        # spawn: a fork would copy the service's event loop and sockets into the worker.
        self._context = multiprocessing.get_context("spawn")
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._workers: set[_Worker] = set()
        self._loading: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def ready(self) -> int:
        """Workers loaded and alive (idle or busy)."""
        return sum(1 for worker in self._workers if worker.process.is_alive())

    async def start(self, load_timeout_s: float) -> None:
        """Start every worker and wait until all have loaded their detectors."""
        for _ in range(self.size):
            self._spawn()
        deadline = asyncio.get_running_loop().time() + load_timeout_s
        while self._loading:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise RuntimeError(f"guardrail workers did not load within {load_timeout_s}s")
            await asyncio.wait(set(self._loading), timeout=remaining)
        if not self._workers:
            raise RuntimeError("no guardrail worker could start")

    def _spawn(self) -> None:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_worker_main, args=(child, self._preload), name="guardrail-worker", daemon=True
        )
        process.start()
        child.close()
        task = asyncio.create_task(self._await_ready(_Worker(process, parent)))
        self._loading.add(task)
        task.add_done_callback(self._loading.discard)

    async def _await_ready(self, worker: _Worker) -> None:
        try:
            await _readable(worker.conn)
            worker.conn.recv()
        except (EOFError, OSError):
            logger.error("guardrail_worker_failed_to_load pid=%s", worker.process.pid)
            self._discard(worker)
            return
        except asyncio.CancelledError:  # closing while it loads
            self._discard(worker)
            raise
        if self._closed:
            self._discard(worker)
            return
        self._workers.add(worker)
        self._idle.put_nowait(worker)
        logger.info("guardrail_worker_ready pid=%s", worker.process.pid)

    async def run(self, texts: list[str], checks: list[dict[str, Any]]) -> Outcome:
        """The engine's outcome (``Outcome.as_json()``) from the next free worker."""
        result = (await self.run_many([(texts, checks)]))[0]
        if isinstance(result, CheckFailed):
            raise result
        return result

    async def run_many(
        self, jobs: Sequence[Job] | Callable[[], Sequence[Job]]
    ) -> list[Outcome | CheckFailed]:
        """Each request's outcome, or the ``CheckFailed`` its detector raised, from one job on
        the next free worker. ``jobs`` may be a function, called once a worker is free: a
        batch then takes in the requests that came while it waited for one.

        Raises (for every request alike) ``PoolBusy`` when no worker is free within the
        queue timeout, ``CheckTimeout`` when the job overruns ``check_timeout_s`` per request
        (the worker is replaced), ``CheckFailed`` when the worker dies."""
        try:
            worker = await asyncio.wait_for(self._idle.get(), self._queue_timeout_s)
        except TimeoutError:
            raise PoolBusy(
                f"No guardrail worker was free within {self._queue_timeout_s:g}s."
            ) from None
        try:
            batch = list(jobs() if callable(jobs) else jobs)
        except BaseException:
            self._idle.put_nowait(worker)
            raise
        budget_s = self._check_timeout_s * max(1, len(batch))
        try:
            worker.conn.send(batch)
            async with asyncio.timeout(budget_s):
                await _readable(worker.conn)
            status, payload = worker.conn.recv()
        except TimeoutError:
            self._replace(worker, "timeout")
            shared = f" (a batch of {len(batch)} checks, which shares its fate)"
            raise CheckTimeout(
                f"The guardrail check did not finish within {budget_s:g}s"
                f"{shared if len(batch) > 1 else ''}."
            ) from None
        except (EOFError, OSError):
            self._replace(worker, "crashed")
            raise CheckFailed("A guardrail worker died during the check.") from None
        except BaseException:
            # Cancelled mid-check (the caller went away): the worker's answer would be read
            # by the next job, so it is not reused.
            self._replace(worker, "cancelled")
            raise
        self._idle.put_nowait(worker)
        if status != "ok":
            return [CheckFailed(f"A guardrail detector raised {payload}.") for _ in batch]
        return [
            result if answer == "ok" else CheckFailed(f"A guardrail detector raised {result}.")
            for answer, result in payload
        ]

    def _replace(self, worker: _Worker, why: str) -> None:
        logger.warning("guardrail_worker_replaced pid=%s why=%s", worker.process.pid, why)
        self._discard(worker)
        if self._on_replaced is not None:
            self._on_replaced(why)
        if not self._closed:
            self._spawn()

    def _discard(self, worker: _Worker) -> None:
        self._workers.discard(worker)
        with contextlib.suppress(OSError):
            worker.conn.close()
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=1)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Ask every worker to stop, then kill what has not after ``timeout_s``."""
        self._closed = True
        for task in list(self._loading):
            task.cancel()
        workers = list(self._workers)
        for worker in workers:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for worker in workers:
            await asyncio.to_thread(worker.process.join, max(0.0, deadline - loop.time()))
            self._discard(worker)
