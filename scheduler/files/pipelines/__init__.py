"""File pipelines: what a file job does with each kind of file (docs/files.md).

A pipeline cuts a file into idempotent parts (``plan``), runs one part through the gateway
(``run_part``), and puts the parts' results together (``finish``). The job runner
(scheduler/files/jobs.py) owns the rest: the state machine, resuming from the parts already
done, concurrency, progress, promises and notifications. ``PIPELINES`` maps a file kind to
its pipeline; each module registers itself there.
"""

# Each pipeline registers itself in PIPELINES when imported.
from scheduler.files.pipelines import batch as batch
