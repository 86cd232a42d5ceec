"""The feasibility model: can a file be done in time, and if not, when could it be (docs/files.md).

A registration is answered at once from three things in Valkey and no scrape:

* the model's **batch capacity**: the throughput the fleet watcher measured
  (``sy:{sy}:throughput:<model>``: ``capacity``, the highest sustained tokens per second,
  slowly decayed), or a conservative default (``SWITCHYARD_BATCH_DEFAULT_TOKENS_PER_SECOND``,
  per-model overrides in ``SWITCHYARD_BATCH_MODEL_TOKENS_PER_SECOND``) while there is no
  measurement, times the share batch work may take (``SWITCHYARD_BATCH_CAPACITY_SHARE``);
* the **ledger** of promises already made on the model (``sy:{sy}:promises:<model>``: a hash of
  promise id → tokens, deadline and the UTC intervals the work may run in);
* the new job: its estimated tokens (``estimate_tokens``), the intervals its SLA's windows
  open between ``not_before`` and its deadline.

The check is earliest-deadline-first: capacity is spent, inside each job's intervals, on the
released job with the earliest deadline; every promise, old and new, must finish by its
deadline. Accepted, the answer is the new job's ETA in that schedule; refused, it is the
earliest deadline that would have been accepted (a bisection over the new job's deadline),
quoted ``QUOTE_MARGIN_SECONDS`` later: work that could start now finishes a second later for
every second the client takes to ask again, so an exact quote would already be refused.

The check and the promise are atomic: the ledger is read with its version in one MULTI/EXEC,
and a script writes the promise only if the version is unchanged (else the check runs
again), so two registrations that fit only one at a time cannot both be promised. Promises
are released on cancel or completion (``release``) and dropped once their deadline is
``PROMISE_GRACE_SECONDS`` past.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

import orjson
import valkey

from gateway.scheduling import keys as scheduling_keys
from governance.sla_windows import Window, open_intervals, zone
from runtime.valkey_urls import transaction

PROMISE_GRACE_SECONDS = 3600.0  # a promise past its deadline this long is expired and dropped
QUOTE_MARGIN_SECONDS = 60.0  # a refusal's earliest possible holds for a retry this soon
_MAX_RETRIES = 20
_BISECT_STEPS = 40
_FAR = 10 * 365 * 86400.0  # an "any time" interval ends this far ahead for the simulation

Interval = tuple[float, float]  # UTC epoch seconds
# A deadline → the candidate's intervals up to it (its windows re-opened to that deadline).
Reintervals = Callable[[float], tuple[Interval, ...]]


throughput_key = scheduling_keys.throughput
ledger_key = scheduling_keys.promises


def ledger_version_key(model: str) -> str:
    """Bumped by every write of a promise: a check commits only on the version it read."""
    return ledger_key(model) + ":v"


# --- estimated tokens ------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenRates:
    """How a file's declared size turns into tokens (settings, docs/files.md)."""

    per_audio_second: float = 25.0
    per_page: float = 800.0
    per_line: float = 600.0
    bytes_per_token: float = 4.0


def estimate_tokens(
    rates: TokenRates,
    *,
    declared_bytes: int,
    seconds: float | None = None,
    pages: int | None = None,
    lines: int | None = None,
) -> int:
    """Tokens the file will cost: audio seconds, pages or lines when declared, else bytes / 4."""
    if seconds is not None:
        estimate = seconds * rates.per_audio_second
    elif pages is not None:
        estimate = pages * rates.per_page
    elif lines is not None:
        estimate = lines * rates.per_line
    else:
        estimate = declared_bytes / rates.bytes_per_token
    return max(1, math.ceil(estimate))


# --- the pure model --------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """A promise (or a candidate): tokens to spend inside ``intervals`` before ``deadline``."""

    id: str
    tokens: float
    deadline: float
    intervals: tuple[Interval, ...]

    def encode(self) -> bytes:
        return orjson.dumps(
            {"tokens": self.tokens, "deadline": self.deadline, "intervals": self.intervals}
        )

    @classmethod
    def decode(cls, job_id: str, raw: bytes | str) -> Job:
        data = orjson.loads(raw)
        return cls(
            id=job_id,
            tokens=float(data["tokens"]),
            deadline=float(data["deadline"]),
            intervals=tuple((float(a), float(b)) for a, b in data["intervals"]),
        )


def job_intervals(
    windows: Sequence[Window], tz_name: str, *, start: datetime, end: datetime
) -> tuple[Interval, ...]:
    """The UTC spans the windows open between ``start`` and ``end`` (no windows: all of it)."""
    spans: list[Interval] = []
    for begin, close in open_intervals(windows, zone(tz_name), start):
        if begin >= end:
            break
        spans.append((begin.timestamp(), min(close, end).timestamp()))
    return tuple(spans)


def edf_finish_times(jobs: Iterable[Job], rate: float, now: float) -> dict[str, float]:
    """When each job finishes if ``rate`` tokens/s go, inside each job's intervals, to the
    open job with the earliest deadline (preemptive EDF). ``math.inf``: never, its intervals
    close before it is done.

    Which jobs are open changes only at interval boundaries, so time is walked from one
    boundary to the next, each job keeping a cursor into its (sorted) intervals. Jobs that
    finished, or whose intervals have all closed, leave the walk, so a long tail (a big
    candidate after a ledger of small promises) costs one step per boundary, not one per job:
    a ledger of thousands of promises is decided in milliseconds."""
    order = sorted(jobs, key=lambda job: (job.deadline, job.id))  # EDF priority, once
    if rate <= 0:
        return {job.id: math.inf for job in order}
    remaining = {job.id: job.tokens for job in order}
    cursor = dict.fromkeys(remaining, 0)
    finish: dict[str, float] = {}
    points = sorted({now} | {t for job in order for span in job.intervals for t in span if t > now})
    live = order  # the jobs still in the walk, in EDF order
    for index in range(len(points) - 1):
        if not live:
            break
        t, end = points[index], points[index + 1]
        gone = False
        for job in live:  # earliest deadline first among the open ones
            if t >= end:
                break
            spans, at = job.intervals, cursor[job.id]
            while at < len(spans) and spans[at][1] <= t:
                at += 1
            cursor[job.id] = at
            if at == len(spans):
                gone = True  # its intervals are over: it never finishes (inf, below)
                continue
            if spans[at][0] > t:
                continue  # not open in [t, end): boundaries are all in points
            left = remaining[job.id]
            need = left / rate
            if t + need <= end:
                t += need
                remaining[job.id] = 0.0
                finish[job.id] = t
                gone = True
            else:
                remaining[job.id] = left - (end - t) * rate
                t = end
        if gone:
            live = [
                job for job in live if remaining[job.id] > 0 and cursor[job.id] < len(job.intervals)
            ]
    for job_id, left in remaining.items():
        if left > 0:
            finish[job_id] = math.inf
    return finish


def _late(jobs: Sequence[Job], finish: Mapping[str, float]) -> list[str]:
    return [job.id for job in jobs if finish[job.id] > job.deadline + 1e-6]


@dataclass(frozen=True)
class Answer:
    """The feasibility answer: ``feasible`` with ``eta`` (its finish in the EDF schedule), or
    not, with ``earliest_possible`` (``None``: not within the job's windows at all)."""

    feasible: bool
    eta: datetime | None
    earliest_possible: datetime | None
    rate: float  # batch tokens per second the answer assumed
    measured: bool  # False: the default rate, no measurement yet


def _at(seconds: float) -> datetime | None:
    return None if math.isinf(seconds) else datetime.fromtimestamp(seconds, UTC)


def _quote(earliest: float) -> datetime | None:
    """The earliest possible as told to the client: a whole second, with the retry margin."""
    return _at(math.ceil(earliest + QUOTE_MARGIN_SECONDS))


def decide(
    ledger: Sequence[Job],
    candidate: Job,
    *,
    rate: float,
    now: float,
    reintervals: Reintervals | None = None,
) -> tuple[bool, float, float]:
    """(feasible, eta, earliest possible deadline) of ``candidate`` against ``ledger``.

    ``reintervals(deadline)`` gives the candidate's intervals for another deadline (its
    windows up to it), for the search of the earliest possible one; without it the
    candidate may run at any time from the start of its first interval."""
    jobs = [*ledger, candidate]
    finish = edf_finish_times(jobs, rate, now)
    # Promises already late (capacity fell since they were made) stay late whatever we do:
    # only the new job's own effect counts against it.
    already_late = set(_late(ledger, edf_finish_times(ledger, rate, now)))
    if set(_late(jobs, finish)) <= already_late:
        return True, finish[candidate.id], candidate.deadline

    def trial(deadline: float) -> Job:
        if reintervals is not None:
            spans = reintervals(deadline)
        else:
            begin = candidate.intervals[0][0] if candidate.intervals else now
            spans = ((begin, deadline),) if begin < deadline else ()
        return Job(candidate.id, candidate.tokens, deadline, spans)

    def fits(deadline: float) -> bool:
        trial_jobs = [*ledger, trial(deadline)]
        return set(_late(trial_jobs, edf_finish_times(trial_jobs, rate, now))) <= already_late

    high = now + _FAR
    if not fits(high):
        return False, math.inf, math.inf
    low = max(candidate.deadline, now)
    for _ in range(_BISECT_STEPS):
        if high - low < 1.0:
            break
        middle = (low + high) / 2
        if fits(middle):
            high = middle
        else:
            low = middle
    return False, math.inf, math.ceil(high)


# --- capacity and the ledger in Valkey -------------------------------------------------------


@dataclass(frozen=True)
class CapacitySettings:
    share: float = 0.3  # SWITCHYARD_BATCH_CAPACITY_SHARE
    default_tokens_per_second: float = 200.0  # conservative: one small replica, batch of one
    model_tokens_per_second: Mapping[str, float] | None = None
    stale_seconds: float = 3600.0  # a measurement older than this is not trusted
    # SWITCHYARD_FILE_JOBS_START_LAG_SECONDS: a job's first call waits for the beat to consume
    # its upload and dispatch it, so the schedule is planned from this long after now.
    start_lag_seconds: float = 0.0


def batch_rate(
    client: valkey.Valkey, model: str, settings: CapacitySettings, *, now: float
) -> tuple[float, bool]:
    """(tokens/s batch work may use on ``model``, whether it was measured)."""
    raw = cast(dict[bytes, bytes], client.hgetall(throughput_key(model)))
    return _rate_from(raw, model, settings, now=now)


def _rate_from(
    raw: Mapping[bytes, bytes] | Mapping[str, str],
    model: str,
    settings: CapacitySettings,
    *,
    now: float,
) -> tuple[float, bool]:
    fields = {_text(k): _text(v) for k, v in raw.items()}
    try:
        capacity = float(fields["capacity"])
        at = float(fields["at_ms"]) / 1000
    except (KeyError, ValueError):
        capacity, at = 0.0, 0.0
    default = (settings.model_tokens_per_second or {}).get(
        model, settings.default_tokens_per_second
    )
    if capacity > 0 and now - at <= settings.stale_seconds:
        # The default is a floor: a model that has only ever seen light traffic has a
        # measured "capacity" far below what it can do, and must not look smaller for it.
        return max(capacity, default) * settings.share, True
    return default * settings.share, False


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# Commit a promise if the ledger's version is still the one the check read (optimistic
# concurrency in one round trip): KEYS ledger, version; ARGV version read, promise id
# ("" for none), promise, expired ids…
_COMMIT = """
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[1]) then return 0 end
redis.call('INCR', KEYS[2])
for i = 4, #ARGV do redis.call('HDEL', KEYS[1], ARGV[i]) end
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], ARGV[2], ARGV[3]) end
return 1
"""


def promise(
    client: valkey.Valkey,
    model: str,
    candidate: Job,
    settings: CapacitySettings,
    *,
    now: float,
    reintervals: Reintervals | None = None,
) -> Answer:
    """Check ``candidate`` against the model's ledger and, if it fits, record it — atomically.

    Two round trips: one MULTI/EXEC reads the ledger, its version and the throughput as one
    snapshot; a script writes the promise only if the version is unchanged (another
    registration promised in between: check again). Expired promises are dropped by the
    same script. A refusal with nothing expired writes nothing: one round trip.

    The EDF schedule starts ``settings.start_lag_seconds`` after ``now``: no job's work starts
    before the beat has consumed its upload and dispatched it (bench/files/deadlines.py)."""
    key, version_key = ledger_key(model), ledger_version_key(model)
    commit = client.register_script(_COMMIT)
    for _ in range(_MAX_RETRIES):
        with transaction(client, key) as pipe:  # one slot: the model's
            pipe.get(version_key)
            pipe.hgetall(key)
            pipe.hgetall(throughput_key(model))
            raw_version, raw_ledger, raw_rate = pipe.execute()  # type: ignore[no-untyped-call]
        rate, measured = _rate_from(raw_rate, model, settings, now=now)
        ledger, expired = [], []
        for job_id, raw in raw_ledger.items():
            job = Job.decode(_text(job_id), raw)
            if job.id == candidate.id:
                continue  # a re-promise (the upload restarts a turnaround) replaces its own
            if job.deadline + PROMISE_GRACE_SECONDS < now:
                expired.append(job.id)
            else:
                ledger.append(job)
        ok, eta, earliest = decide(
            ledger,
            candidate,
            rate=rate,
            now=now + settings.start_lag_seconds,
            reintervals=reintervals,
        )
        if ok or expired:
            written = commit(
                keys=[key, version_key],
                args=[
                    int(raw_version or 0),
                    candidate.id if ok else "",
                    candidate.encode().decode() if ok else "",
                    *expired,
                ],
            )
            if not written:
                continue  # the ledger changed since it was read
        return Answer(
            feasible=ok,
            eta=_at(eta) if ok else None,
            earliest_possible=None if ok else _quote(earliest),
            rate=rate,
            measured=measured,
        )
    raise RuntimeError(f"the promise ledger of {model} kept changing; try again")


def record(client: valkey.Valkey, model: str, job: Job) -> None:
    """Write ``job`` into the ledger without a check (a job already accepted whose re-promise
    no longer fits: its work is still coming, and later checks must count it)."""
    with transaction(client, ledger_key(model)) as pipe:
        pipe.hset(ledger_key(model), job.id, job.encode().decode())
        pipe.incr(ledger_version_key(model))
        pipe.execute()  # type: ignore[no-untyped-call]


def release(client: valkey.Valkey, model: str, job_id: str) -> bool:
    """Drop a promise (cancelled, completed, expired); whether there was one."""
    return bool(client.hdel(ledger_key(model), job_id))
