"""Fixtures for the scheduler's tests that run real Celery workers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from config.processes import PYTHON, ManagedProcess
from tests.conftest import RecordsStore
from tests.scheduler.test_usage import _database_url

RecordsWorkerFactory = Callable[[str], ManagedProcess]


@pytest.fixture
def start_records_worker(
    valkey_url: str, records_store: RecordsStore, tmp_path: Path
) -> Iterator[RecordsWorkerFactory]:
    """Real workers (solo pool: a task runs in the process a test may kill) on the test's
    Valkey, database and bucket; ``start(keys)`` gives them the records keyring ``keys``."""
    started: list[ManagedProcess] = []

    def start(keys: str) -> ManagedProcess:
        process = ManagedProcess(
            f"records-worker-{len(started)}",
            [
                PYTHON, "-m", "celery", "-A", "config.celery", "worker", "--pool", "solo",
                "--loglevel", "INFO", "--hostname", f"records-{len(started)}@%h",
                "--without-mingle", "--without-gossip", "--without-heartbeat",
            ],
            env={
                "SWITCHYARD_VALKEY_URL": valkey_url,
                "SWITCHYARD_DATABASE_URL": _database_url(),
                "SWITCHYARD_RUN_DIR": str(tmp_path),
                "SWITCHYARD_RECORDS_KEYS": keys,
                **records_store.env,
            },
        )  # fmt: skip
        started.append(process)
        process.start(ready=lambda: "ready." in process.log_text(), timeout=60)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.stop()
