"""The job runner: one file's pipeline, split into idempotent parts, run to its end.

``file_job_run`` is what the ``scheduler.run_file_job`` task calls with the lease the
dispatcher took (scheduler/files/dispatch.py). It

1. moves the file to ``running`` (``file_started``), unless it resumes one already running;
2. creates its ``FilePart`` rows once from ``pipeline.plan`` (unique (registration, index):
   a second plan after a crash finds them and is not used). Planning reads the whole file
   (decodes the audio, extracts the PDF) and is tried at most ``SWITCHYARD_FILE_JOB_PLAN_ATTEMPTS``
   times, each counted before it starts: a plan that raises, or kills its worker, fails the
   file then rather than come back on every dispatch and hold a place other tenants' jobs
   wait for;
3. runs the parts not done on a small thread pool (``SWITCHYARD_FILE_JOB_PART_CONCURRENCY``):
   each part calls the gateway as the job (its SLA class's job key) and writes its output
   object; the part's row is set done with its output and tokens in one conditional update,
   and the file's progress is done / total. Only this thread touches the database: the pool
   runs pipelines, the gateway and object storage;
4. when every part is done: ``pipeline.finish`` assembles the outputs, ``file_done`` stores
   them with the counts, and the feasibility promise is released.

A ``Retryable`` part (the gateway's 429/503, a connection error) is retried with exponential
backoff (at least its ``Retry-After``), up to ``SWITCHYARD_FILE_JOB_PART_ATTEMPTS`` attempts in
all; then, or on ``PartFailed``, the file fails with the reason and its promise is released.

Between parts the runner checks, and stops at the boundary when: the file is no longer
running (cancelled, expired), its lease was lost (a slower twin of a re-dispatched job), or
its processing window closed (the dispatcher resumes it when the window reopens). A worker
killed mid-job loses nothing: its lease lapses, the dispatcher hands the job out again, and
the parts not done (a part left ``running`` by the dead worker included) run again.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import pkgutil
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, cast

import valkey
from django.conf import settings
from django.db import IntegrityError
from django.utils import timezone

from governance.audit import Actor
from governance.choices import Capability, FileKind, FileState
from governance.errors import Conflict
from governance.job_keys import job_key_for
from governance.models import FileRegistration
from governance.store import valkey_client
from scheduler.files import feasibility
from scheduler.files import pipelines as pipelines_package
from scheduler.files.dispatch import may_run
from scheduler.files.gateway_client import GatewayClient
from scheduler.files.leases import Heartbeat, lease_drop, lease_renew
from scheduler.files.objects import FilesStore, output_prefix
from scheduler.files.pipelines.base import (
    PIPELINES,
    GatewayCaller,
    JobContext,
    ObjectStore,
    PartFailed,
    PartResult,
    Pipeline,
    Retryable,
)
from scheduler.files.states import (
    FINAL_STATES,
    file_done,
    file_failed,
    file_progress,
    file_started,
)
from scheduler.models import FilePart, PartState

logger = logging.getLogger(__name__)

ACTOR = Actor.system("file-jobs")
RESULT_KEY = "_result"  # a done part's counts, kept in its spec (a resumed job's finish reads them)
BACKOFF_BASE_SECONDS = 1.0


@dataclass(frozen=True)
class Attempted:
    result: PartResult
    attempts: int


class PartGaveUp(Exception):
    """A part kept failing with Retryable until its attempts ran out."""


class PlanAgain(Exception):
    """The plan raised with attempts left: the job is handed out again at the next dispatch."""


PLAN_ATTEMPTS_PREFIX = "sy:{filejobs}:plans:"
PLAN_ATTEMPTS_TTL = 7 * 24 * 3600  # beyond any job's deadline


def load_pipelines() -> None:
    """Import every module of ``scheduler.files.pipelines``: each registers its own kind, so the
    runner knows no kind by name (the batch pipeline included)."""
    for module in pkgutil.iter_modules(pipelines_package.__path__):
        importlib.import_module(f"{pipelines_package.__name__}.{module.name}")


def job_context(registration: FileRegistration) -> JobContext:
    use_case = registration.use_case
    allowed = list(use_case.allowed_models.order_by("public_id"))
    embedding = next(
        (m.public_id for m in allowed if Capability.EMBEDDINGS in (m.capabilities or [])), ""
    )
    prompt = registration.metadata.get("prompt") if registration.metadata else None
    audio_seconds = registration.declared_seconds
    rate = settings.FILE_TOKENS_PER_AUDIO_SECOND
    if audio_seconds is None and registration.kind == FileKind.AUDIO and rate > 0:
        audio_seconds = registration.estimated_tokens / rate  # what the promise was sized on
    return JobContext(
        registration_id=registration.pk,
        kind=registration.kind,
        model=registration.model.public_id,
        models=[m.public_id for m in allowed],
        filename=registration.filename,
        source_object=registration.source_object,
        output_prefix=output_prefix(registration.source_object),
        request_endpoint=registration.request_endpoint,
        settings={
            "prompt": prompt if isinstance(prompt, str) else "",
            "embedding_model": embedding,
            "capabilities": list(registration.model.capabilities or []),
        },
        audio_seconds=audio_seconds,
        pages=registration.declared_pages,
    )


def file_job_run(
    registration_id: int,
    token: str,
    *,
    client: valkey.Valkey | None = None,
    store: ObjectStore | None = None,
    gateway: GatewayCaller | None = None,
) -> str:
    """Run (or resume) one job under the lease ``token``; what became of it."""
    client = client or valkey_client()
    lease_seconds = settings.FILE_JOB_LEASE_SECONDS
    registration = (
        FileRegistration.objects.select_related("use_case__tenant", "model", "sla_class")
        .filter(pk=registration_id)
        .first()
    )
    if registration is None or registration.state in FINAL_STATES:
        lease_drop(client, registration_id, token)
        return "ended" if registration is not None else "gone"
    if not lease_renew(client, registration_id, token, lease_seconds):
        return "lease_lost"  # re-dispatched meanwhile: the newer run owns the job
    own_gateway = gateway is None
    if gateway is None:
        gateway = GatewayClient(
            settings.FILE_JOBS_GATEWAY_URL,
            job_key_for(registration.use_case_id, registration.sla_class_id),
            timeout=settings.FILE_JOBS_GATEWAY_TIMEOUT_SECONDS,
        )
    try:
        with Heartbeat(client, registration_id, token, lease_seconds) as heartbeat:
            outcome = _run(registration, heartbeat, store or FilesStore(), gateway, client)
    finally:
        lease_drop(client, registration_id, token)
        if own_gateway and isinstance(gateway, GatewayClient):
            gateway.close()
    logger.info("file_job_ran registration=%s outcome=%s", registration_id, outcome)
    return outcome


def _run(
    registration: FileRegistration,
    heartbeat: Heartbeat,
    store: ObjectStore,
    gateway: GatewayCaller,
    client: valkey.Valkey,
) -> str:
    load_pipelines()
    pipeline = PIPELINES.get(registration.kind)
    if pipeline is None:
        return _fail(registration, f"No pipeline processes {registration.kind} files.", client)
    try:
        if registration.state == FileState.QUEUED:
            registration = file_started(actor=ACTOR, registration=registration)
    except Conflict:
        return "raced"
    job = job_context(registration)
    try:
        parts = _parts(registration, pipeline, job, store, client)
    except PartFailed as exc:
        return _fail(registration, str(exc), client)
    except PlanAgain:
        return "plan_again"
    if not parts:
        return _fail(registration, "The file has nothing to process.", client)
    stop, failure = _run_parts(registration, pipeline, job, parts, heartbeat, store, gateway)
    if failure:
        return _fail(registration, failure, client)
    if stop:
        return stop
    return _finish(registration, pipeline, job, store, client)


def _parts(
    registration: FileRegistration,
    pipeline: Pipeline,
    job: JobContext,
    store: ObjectStore,
    client: valkey.Valkey,
) -> list[FilePart]:
    """The job's parts, planned once: a resumed job finds its rows and does not plan again."""
    parts = list(FilePart.objects.filter(registration=registration).order_by("index"))
    if parts:
        return parts
    specs = _plan(registration, pipeline, job, store, client)
    with contextlib.suppress(IntegrityError):  # a twin planned the same parts first: theirs stand
        FilePart.objects.bulk_create(
            [
                FilePart(registration=registration, index=i, spec=spec)
                for i, spec in enumerate(specs)
            ],
            ignore_conflicts=True,
        )
    return list(FilePart.objects.filter(registration=registration).order_by("index"))


def _plan(
    registration: FileRegistration,
    pipeline: Pipeline,
    job: JobContext,
    store: ObjectStore,
    client: valkey.Valkey,
) -> list[dict[str, Any]]:
    """``pipeline.plan``, within the job's plan attempts. PartFailed: the file fails (the
    pipeline's own reason, or the attempts are spent); PlanAgain: it raised, try later."""
    limit = settings.FILE_JOB_PLAN_ATTEMPTS
    key = f"{PLAN_ATTEMPTS_PREFIX}{registration.pk}"
    attempt = cast(int, client.incr(key))
    client.expire(key, PLAN_ATTEMPTS_TTL)
    if attempt > limit:  # the earlier attempts ended without a word: their worker died in them
        raise PartFailed(
            f"The file could not be planned: its worker stopped while reading it, {limit} times."
        )
    try:
        specs = pipeline.plan(job, store)
    except PartFailed:
        raise
    except Exception as exc:
        logger.exception(
            "file_plan_crashed registration=%s attempt=%s of=%s", registration.pk, attempt, limit
        )
        if attempt >= limit:
            raise PartFailed(
                f"The file could not be planned: reading it failed {limit} times "
                f"({type(exc).__name__})."
            ) from exc
        raise PlanAgain from exc
    client.delete(key)
    return specs


def _stop_reason(registration: FileRegistration, heartbeat: Heartbeat) -> str | None:
    if heartbeat.lost.is_set():
        return "lease_lost"
    registration.refresh_from_db(fields=["state"])
    if registration.state != FileState.RUNNING:
        return str(registration.state)
    if not may_run(registration, timezone.now()):
        return "outside_window"
    return None


def _run_parts(
    registration: FileRegistration,
    pipeline: Pipeline,
    job: JobContext,
    parts: Sequence[FilePart],
    heartbeat: Heartbeat,
    store: ObjectStore,
    gateway: GatewayCaller,
) -> tuple[str | None, str | None]:
    """Run the parts not done; (why it stopped early, why the file fails) — both None: all
    parts are done."""
    total = len(parts)
    done = sum(1 for part in parts if part.state == PartState.DONE)
    queue = deque(part for part in parts if part.state != PartState.DONE)
    width = settings.FILE_JOB_PART_CONCURRENCY
    stop: str | None = None
    failure: str | None = None
    running: dict[Future[Attempted], FilePart] = {}
    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="file-part") as pool:
        while queue or running:
            while queue and len(running) < width and stop is None and failure is None:
                stop = _stop_reason(registration, heartbeat)
                if stop is not None:
                    break
                part = queue.popleft()
                FilePart.objects.filter(pk=part.pk).exclude(state=PartState.DONE).update(
                    state=PartState.RUNNING, started_at=timezone.now()
                )
                future = pool.submit(_attempt, pipeline, job, part, gateway, store)
                running[future] = part
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                part = running.pop(future)
                try:
                    attempted = future.result()
                except (PartFailed, PartGaveUp) as exc:
                    _part_failed(part, str(exc))
                    failure = failure or f"Part {part.index + 1} of {total}: {exc}"
                    continue
                except Exception as exc:
                    logger.exception("file_part_crashed registration=%s", registration.pk)
                    _part_failed(part, f"{type(exc).__name__}: {exc}")
                    failure = failure or (
                        f"Part {part.index + 1} of {total} failed unexpectedly "
                        f"({type(exc).__name__})."
                    )
                    continue
                if _part_done(part, attempted):
                    done += 1
                    file_progress(registration=registration, progress=done / total)
    return stop, failure


def _attempt(
    pipeline: Pipeline,
    job: JobContext,
    part: FilePart,
    gateway: GatewayCaller,
    store: ObjectStore,
) -> Attempted:
    """Run one part, retrying what may pass, with exponential backoff (at least the
    gateway's Retry-After, at most ``FILE_JOB_RETRY_MAX_SECONDS``)."""
    limit = settings.FILE_JOB_PART_ATTEMPTS
    cap = settings.FILE_JOB_RETRY_MAX_SECONDS
    attempt = part.attempts
    last = ""
    for tried in range(1, limit + 1):
        attempt += 1
        try:
            result = pipeline.run_part(job, part.spec, part.index, gateway, store)
        except Retryable as exc:
            last = str(exc)
            if tried == limit:
                break
            delay = min(cap, max(exc.retry_after, BACKOFF_BASE_SECONDS * 2 ** (tried - 1)))
            logger.info(
                "file_part_retry registration=%s part=%s attempt=%s in=%.1fs why=%s",
                job.registration_id,
                part.index,
                tried,
                delay,
                exc,
            )
            time.sleep(delay)
            continue
        return Attempted(result, attempt)
    raise PartGaveUp(f"gave up after {limit} attempts: {last}")


def _part_done(part: FilePart, attempted: Attempted) -> bool:
    """Set the part done with its output, in one conditional update; whether it moved."""
    result = attempted.result
    spec = dict(part.spec)
    if result.counts:
        spec[RESULT_KEY] = {"counts": dict(result.counts)}
    return bool(
        FilePart.objects.filter(pk=part.pk)
        .exclude(state=PartState.DONE)
        .update(
            state=PartState.DONE,
            output_object=result.output_object,
            tokens=max(0, int(result.tokens)),
            attempts=attempted.attempts,
            spec=spec,
            error="",
            finished_at=timezone.now(),
        )
    )


def _part_failed(part: FilePart, error: str) -> None:
    FilePart.objects.filter(pk=part.pk).exclude(state=PartState.DONE).update(
        state=PartState.FAILED,
        attempts=part.attempts + 1,
        error=error[:2000],
        finished_at=timezone.now(),
    )


def _results(registration: FileRegistration) -> list[PartResult]:
    results = []
    for part in FilePart.objects.filter(registration=registration).order_by("index"):
        kept = part.spec.get(RESULT_KEY) if isinstance(part.spec, dict) else None
        counts: Mapping[str, Any] = kept.get("counts", {}) if isinstance(kept, dict) else {}
        results.append(
            PartResult(
                output_object=part.output_object,
                tokens=part.tokens,
                counts={k: int(v) for k, v in counts.items()},
            )
        )
    return results


def _finish(
    registration: FileRegistration,
    pipeline: Pipeline,
    job: JobContext,
    store: ObjectStore,
    client: valkey.Valkey,
) -> str:
    results = _results(registration)
    try:
        outputs, counts = pipeline.finish(job, results, store)
    except PartFailed as exc:
        return _fail(registration, str(exc), client)
    tallies = {
        **{k: int(v) for k, v in counts.items()},
        "parts": len(results),
        "tokens": sum(r.tokens for r in results),
    }
    try:
        file_done(actor=ACTOR, registration=registration, outputs=outputs, counts=tallies)
    except Conflict:
        registration.refresh_from_db(fields=["state"])
        return str(registration.state)
    feasibility.release(client, registration.model.public_id, str(registration.pk))
    return FileState.DONE


def _fail(registration: FileRegistration, failure: str, client: valkey.Valkey) -> str:
    logger.warning("file_job_failed registration=%s why=%s", registration.pk, failure)
    try:
        file_failed(actor=ACTOR, registration=registration, failure=failure)
    except Conflict:
        registration.refresh_from_db(fields=["state"])
        return str(registration.state)
    feasibility.release(client, registration.model.public_id, str(registration.pk))
    return FileState.FAILED
