"""A task goes through the real Valkey broker to a real worker process and back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ops.processes import PYTHON, ManagedProcess
from runtime.valkey_urls import for_kombu


@pytest.fixture
def worker(valkey_url: str, tmp_path) -> Iterator[ManagedProcess]:
    process = ManagedProcess(
        "celery-worker",
        [
            PYTHON,
            "-m",
            "celery",
            "-A",
            "config.celery",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
            "--hostname",
            "test-worker@%h",
            "--without-mingle",
            "--without-gossip",
        ],
        env={"SWITCHYARD_VALKEY_URL": valkey_url, "SWITCHYARD_RUN_DIR": str(tmp_path)},
    )
    process.start(ready=lambda: "ready." in process.log_text(), timeout=60)
    try:
        yield process
    finally:
        process.stop()


def test_a_task_round_trips_through_the_valkey_broker(
    worker: ManagedProcess, valkey_url: str
) -> None:
    from config.celery import app
    from scheduler.tasks import ping

    app.conf.update(broker_url=for_kombu(valkey_url), result_backend=for_kombu(valkey_url))
    result = ping.delay("hello")
    answer = result.get(timeout=30)
    assert answer["pong"] == "hello"
    assert answer["worker"]
    assert "scheduler.ping" in worker.log_text()
