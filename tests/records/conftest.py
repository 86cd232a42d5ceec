"""Fixtures for the records tests that run real Celery workers."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ops.processes import ManagedProcess
from testkit.records_store import RecordsStore
from tests.conftest import CeleryWorkerFactory

RecordsWorkerFactory = Callable[[str], ManagedProcess]


@pytest.fixture
def start_records_worker(
    start_celery_worker: CeleryWorkerFactory, records_store: RecordsStore
) -> RecordsWorkerFactory:
    """Real workers on the test's Valkey, database and bucket; ``start(keys)`` gives them the
    records keyring ``keys``."""

    def start(keys: str) -> ManagedProcess:
        return start_celery_worker("records", SWITCHYARD_RECORDS_KEYS=keys, **records_store.env)

    return start
