"""The whole stack across hosts (network namespaces, testkit/netns.py), as issue 16 asks:
a Valkey Cluster of three primaries and three replicas on three hosts (each replica on
another host than its primary), three gateways on three hosts (one with its wall clock 45 s
ahead), two simulators on two hosts, PostgreSQL on its own host, a Celery worker (the usage
persister, ``scheduler.persist_usage``) on another with its one-server broker (Celery cannot
use a Cluster, docs/valkey-ha.md); the test itself is the client, on the bridge.

One stack for the module (it takes most of the time), two scenes:

- a primary killed under load, with ``SWITCHYARD_GATEWAY_USAGE_WAIT_REPLICAS=1``: it is
  the primary of the loaded pool's slot and of ``sy:usage``'s; its replica on another host
  takes over, every refusal meanwhile is a 503 with a Retry-After, every gateway serves
  again, and every request answered 200 has exactly one interaction record in PostgreSQL;
- a gateway cut off from every Valkey host while it holds both slots of a replica: it fails
  closed (503, then ``policy_stale``), the other gateways get the slots back once its leases
  expire (the reaper), while it is still cut off; healed, it serves again.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import valkey
from celery import Celery

from gateway.accounting import USAGE_STREAM
from gateway.scheduling import keys
from ops.processes import (
    PYTHON,
    ManagedProcess,
    gateway_command,
    http_ready,
    port_open,
    wait_until,
)
from runtime.valkey_urls import for_kombu, sync_client
from testkit.client_threads import ClientThreads
from testkit.netns import NetnsUnavailable, Network, skewed
from testkit.policy import PolicyBuilder
from testkit.postgres_host import PostgresHost
from testkit.valkey_ha import VALKEY_SERVER, ClusterSet, names_on_nodes

# The stack's start (PostgreSQL, migrations, eleven processes on two cores) is in the first
# test's time.
pytestmark = pytest.mark.timeout(240)

SERVED = "llama-scene"
STALENESS_S = 5
LEASE_S = 2
SLOW_FIRST_BYTE_MS = 8000
SLOTS = 2  # the slow replica's concurrency (max_in_flight_per_replica)
LOAD_CAP = 900  # requests at most in the failover scene


@dataclass
class Scene:
    network: Network
    cluster: ClusterSet
    postgres: PostgresHost
    setup: valkey.Valkey
    gateways: list[str]  # base URLs: g1, g2, g3 (g2's clock is 45 s ahead)
    fast: str  # a model on the fast simulator, its pool on the primary killed in scene a
    slow: str  # a model on the slow simulator, SLOTS requests at once
    key: str  # interactive, short queue timeout, metadata records
    patient: str  # batch class: waits long enough in the queue for reaped capacity
    celery: Celery
    logs: Path
    processes: dict[str, ManagedProcess] = field(default_factory=dict)


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    logs = tmp_path_factory.mktemp("scene")
    names = ["v1", "v2", "v3", "g1", "g2", "g3", "s1", "s2", "pg", "worker"]
    try:
        network = Network(names)
    except NetnsUnavailable as exc:
        pytest.fail(f"the multi-host tests need network namespaces: {exc}", pytrace=False)
    postgres: PostgresHost | None = None
    try:
        postgres = PostgresHost(network["pg"]).start()
        cluster = ClusterSet(
            logs / "cluster",
            replicas=1,
            hosts=[network["v1"], network["v2"], network["v3"]],
            node_timeout_ms=1000,
        ).start()
        yield _start(network, cluster, postgres, logs)
    finally:
        network.close()
        if postgres is not None:
            postgres.stop()


def _start(network: Network, cluster: ClusterSet, postgres: PostgresHost, logs: Path) -> Scene:
    processes: dict[str, ManagedProcess] = {}
    sims = {}
    slow_first_byte = ["--fault-slow-first-byte-ms", str(SLOW_FIRST_BYTE_MS)]
    for name, extra in (("s1", ["--time-scale", "0"]), ("s2", slow_first_byte)):
        host = network[name]
        url = f"http://{host.address}:8000"
        processes[name] = host.process(
            "simulator",
            [PYTHON, "-m", "simulator", "--host", host.address, "--port", "8000",
             "--served-model-name", SERVED, *extra],
            log_dir=logs,
        )  # fmt: skip
        processes[name].start(ready=http_ready(url + "/health"), timeout=30)
        sims[name] = url

    # The fast pool's slot on the primary that also owns sy:usage: the one scene a kills.
    victim = cluster.owner_of(USAGE_STREAM)
    owners = cluster.owners()
    fast = names_on_nodes("fast", len(cluster.primaries), keys.pool_prefix, owners)[
        cluster.primaries.index(victim)
    ]
    slow = "slow-model"
    policy = PolicyBuilder()
    policy.model(fast, [sims["s1"]], served_name=SERVED)
    policy.model(slow, [sims["s2"]], served_name=SERVED, max_in_flight_per_replica=SLOTS)
    # A request queued on the killed primary may wait out its queue timeout: short here.
    policy.priority_class("interactive", rank=0, queue_timeout_s=3)
    policy.priority_class("batch", rank=1, queue_timeout_s=30)
    key = policy.key(use_case="chatbot", priority_class="interactive")
    policy.record(key, "metadata")  # one interaction record per request, by request id
    patient = policy.key(use_case="reports", priority_class="batch")
    setup = sync_client(cluster.url)
    policy.publish(setup)

    # The usage persister: the worker's scheduler.persist_usage, into PostgreSQL.
    worker = network["worker"]
    broker = f"valkey://{worker.address}:6379/0"
    processes["broker"] = worker.process(
        "broker",
        [VALKEY_SERVER, "--bind", worker.address, "--port", "6379", "--save", "",
         "--appendonly", "no", "--protected-mode", "no", "--dir", str(logs)],
        log_dir=logs,
    )  # fmt: skip
    processes["broker"].start(ready=port_open(6379, host=worker.address), timeout=10)
    django_env = {
        "SWITCHYARD_VALKEY_URL": cluster.url,
        "SWITCHYARD_CELERY_BROKER_URL": broker,
        "SWITCHYARD_CHANNELS_VALKEY_URL": broker,
        "SWITCHYARD_DATABASE_URL": postgres.url,
        "SWITCHYARD_RUN_DIR": str(logs),
    }
    migrated = worker.run(
        [PYTHON, "manage.py", "migrate", "--noinput"], env=_environ(django_env), timeout=180
    )
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    celery_worker = worker.process(
        "celery",
        [PYTHON, "-m", "celery", "-A", "config.celery", "worker", "--pool", "solo",
         "--loglevel", "INFO", "--hostname", "persister@%h",
         "--without-mingle", "--without-gossip", "--without-heartbeat"],
        env=django_env,
        log_dir=logs,
    )  # fmt: skip
    celery_worker.start(ready=lambda: "ready." in celery_worker.log_text(), timeout=90)
    processes["celery"] = celery_worker

    env = {
        "SWITCHYARD_VALKEY_URL": cluster.url,
        "SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS": "0.1",
        "SWITCHYARD_GATEWAY_POLICY_MAX_STALENESS_SECONDS": str(STALENESS_S),
        "SWITCHYARD_FLEET_SCRAPE_INTERVAL_SECONDS": "0.1",
        # Two cores for the whole scene: fleet figures may lag a scrape or two.
        "SWITCHYARD_GATEWAY_FLEET_STALE_SECONDS": "5",
        "SWITCHYARD_GATEWAY_USAGE_WAIT_REPLICAS": "1",
        "SWITCHYARD_GATEWAY_LEASE_SECONDS": str(LEASE_S),
        "SWITCHYARD_GATEWAY_HEARTBEAT_SECONDS": "2",
    }
    g1 = network["g1"]
    watcher = g1.process(
        "fleet-watcher", [PYTHON, "-m", "gateway.fleet_watcher"], env=env, log_dir=logs
    )
    watcher.start(
        ready=lambda: all(setup.hlen(keys.fleet(m)) for m in (fast, slow)),
        timeout=30,
    )
    processes["fleet-watcher"] = watcher
    gateways = []
    for name, skew in (("g1", 0), ("g2", 45), ("g3", 0)):
        host = network[name]
        command = gateway_command(host.address, 8080)
        processes[name] = host.process(
            "gateway", skewed(command, offset_s=skew) if skew else command, env=env,
            log_dir=logs,
        )  # fmt: skip
        base = f"http://{host.address}:8080"
        processes[name].start(ready=http_ready(base + "/healthz", expect=200), timeout=60)
        gateways.append(base)

    celery = Celery("scene-client", broker=for_kombu(broker), set_as_current=False)
    return Scene(
        network, cluster, postgres, setup, gateways, fast, slow, key, patient, celery, logs,
        processes,
    )  # fmt: skip


def _environ(extra: dict[str, str]) -> dict[str, str]:
    import os

    return {**os.environ, **extra}


@dataclass
class Answer:
    request_id: str
    gateway: int
    status: int
    code: str
    retry_after: str | None


def chat(
    client: httpx.Client, base: str, key: str, model: str, request_id: str, gateway: int = 0
) -> Answer:
    response = client.post(
        base + "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {key}", "X-Request-Id": request_id},
    )
    code = "" if response.status_code == 200 else response.json()["error"]["code"]
    retry_after = response.headers.get("retry-after")
    return Answer(request_id, gateway, response.status_code, code, retry_after)


class Load(ClientThreads):
    """Threads sending chats round-robin over the gateways, until stopped or LOAD_CAP."""

    def __init__(self, scene: Scene, threads: int = 6) -> None:
        super().__init__(threads)
        self.scene = scene
        self.ids = itertools.count()
        self.answers: list[Answer] = []

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stopping.is_set():
                n = next(self.ids)
                if n >= LOAD_CAP:
                    return
                gateway = n % len(self.scene.gateways)
                answer = chat(client, self.scene.gateways[gateway], self.scene.key,
                              self.scene.fast, f"a-{n}", gateway)  # fmt: skip
                self.answers.append(answer)
                if answer.status != 200:
                    # As a client told to retry would (a refusal takes a millisecond: without
                    # a pause the bounded load would be spent in the failover's first second).
                    time.sleep(0.2)

    def answered(self) -> int:
        return sum(a.status == 200 for a in list(self.answers))


def persisted(scene: Scene, prefix: str) -> dict[str, tuple[int, int]]:
    """request id → (rows, status) of the interaction records in PostgreSQL."""
    with scene.postgres.connect() as connection:
        rows = connection.execute(
            "SELECT request_id, count(*), max(status) FROM scheduler_interactionrecord "
            "WHERE request_id LIKE %s GROUP BY request_id",
            (prefix + "%",),
        ).fetchall()
    return {str(rid): (int(str(n)), int(str(status))) for rid, n, status in rows}


def test_a_primary_killed_under_load_fails_over_and_every_answered_request_is_in_postgres(
    scene: Scene,
) -> None:
    victim = scene.cluster.owner_of(USAGE_STREAM)
    assert scene.cluster.owner_of(keys.pool_prefix(scene.fast)) is victim

    with Load(scene) as load:
        # GIVEN the three gateways answering on the pool whose primary also owns sy:usage
        assert wait_until(lambda: load.answered() >= 60, timeout=60), Counter(
            (a.status, a.code) for a in load.answers
        )
        # WHEN that primary is killed mid-load
        killed_at = time.monotonic()
        scene.cluster.kill(victim)
        promoted = scene.cluster.wait_failover(victim)
        failover_s = time.monotonic() - killed_at
        # THEN its replica, on another host, takes its slots; the gateways follow
        after = len(load.answers)
        resumed = wait_until(
            lambda: sum(a.status == 200 for a in load.answers[after:]) >= 60, timeout=60
        )
        resumed_s = time.monotonic() - killed_at
    assert resumed, Counter((a.status, a.code) for a in load.answers[after:])
    assert promoted.address != victim.address
    print(f"cluster failover: promoted in {failover_s:.1f} s, load resumed by {resumed_s:.1f} s")
    # (Back as an orchestrator restarts it: the replica that the new primary's usage
    # batches wait for.)
    scene.cluster.restart(victim, replica_of=promoted)

    answers = load.answers
    refused = Counter((a.status, a.code) for a in answers if a.status != 200)
    print(f"answers: {len(answers)}, refused: {dict(refused)}")
    # (queue_lost: a request queued on the killed primary whose place the promoted replica
    # never had, told so at its next poll)
    assert set(refused) <= {
        (503, "admission_unavailable"),
        (503, "queue_lost"),
        (503, "queue_timeout"),
    }, refused
    assert refused, "the kill went unnoticed: no request met the failover"
    assert all(a.retry_after for a in answers if a.status == 503), [
        a for a in answers if a.status == 503 and not a.retry_after
    ][:3]
    # AND every gateway serves again
    with httpx.Client(timeout=30) as client:
        for n, base in enumerate(scene.gateways):

            def serves(base: str = base, n: int = n) -> bool:
                return chat(client, base, scene.key, scene.fast, f"a-after-{n}").status == 200

            assert wait_until(serves, timeout=30), base

    # AND every request answered 200 has exactly one record in PostgreSQL, written by the
    # persister (the worker's task); a batch written twice across the failover (at least
    # once) is one record still: the persister upserts by record id.
    answered = {a.request_id for a in answers if a.status == 200}

    def all_persisted() -> bool:
        scene.celery.send_task("scheduler.persist_usage")
        return answered <= set(persisted(scene, "a-"))

    assert wait_until(all_persisted, timeout=40, interval=2), (
        f"{len(answered - set(persisted(scene, 'a-')))} of {len(answered)} answered "
        "requests have no record in PostgreSQL:\n" + scene.processes["celery"].log_tail()
    )
    rows = persisted(scene, "a-")
    assert all(rows[rid] == (1, 200) for rid in answered)
    # No record for a request that was refused (none reached a replica).
    assert {rid for rid, (_, status) in rows.items() if status == 200} - {
        f"a-after-{n}" for n in range(3)
    } == answered


def test_a_partitioned_gateway_fails_closed_and_its_capacity_returns_to_the_others(
    scene: Scene,
) -> None:
    g1, g2, g3 = scene.gateways
    third = scene.network["g3"]
    valkey_hosts = [scene.network[n] for n in ("v1", "v2", "v3")]

    def leases_of(prefix: str) -> list[str]:
        members: Any = scene.setup.zrange(keys.leases(scene.slow), 0, -1)
        return [m.decode() for m in members if m.decode().startswith(prefix)]

    # GIVEN g3 holds both slots of the slow replica (its requests take 8 s upstream)
    held: list[Answer] = []

    def hold(n: int) -> None:
        with httpx.Client(timeout=60) as client:
            held.append(chat(client, g3, scene.patient, scene.slow, f"b-g3-{n}", 2))

    holders = [threading.Thread(target=hold, args=(n,)) for n in range(SLOTS)]
    for thread in holders:
        thread.start()
    try:
        assert wait_until(lambda: len(leases_of("b-g3-")) == SLOTS, timeout=20)

        # WHEN g3's host is cut off from every Valkey host (the client still reaches it)
        third.partition(*valkey_hosts)
        # THEN g3 fails closed: 503s that say why, then policy_stale once its snapshot is
        # older than the staleness bound
        seen: list[Answer] = []
        with httpx.Client(timeout=30) as client:

            def refuses_stale() -> bool:
                seen.append(chat(client, g3, scene.key, scene.fast, f"b-probe-{len(seen)}"))
                return seen[-1].code == "policy_stale"

            assert wait_until(refuses_stale, timeout=STALENESS_S + 30, interval=0.2), seen
        assert {(a.status, a.code) for a in seen} <= {
            (503, "admission_unavailable"),
            (503, "policy_stale"),
        }, seen
        assert all(a.retry_after for a in seen if a.code == "admission_unavailable"), seen

        # AND its leases expire unrenewed and the reaper (on g1, g2) gives the slots back:
        # the other gateways are admitted to the slow replica while g3 is still cut off
        assert wait_until(lambda: not leases_of("b-g3-"), timeout=LEASE_S + 20), _state(scene)
        others: list[Answer] = []

        def through(base: str, n: int) -> None:
            with httpx.Client(timeout=60) as client:
                others.append(chat(client, base, scene.patient, scene.slow, f"b-other-{n}", n))

        sent = [threading.Thread(target=through, args=(b, n)) for n, b in enumerate((g1, g2))]
        for thread in sent:
            thread.start()
        assert wait_until(lambda: len(leases_of("b-other-")) == SLOTS, timeout=20)
        for thread in sent:
            thread.join()
        assert [(a.status, a.code) for a in others] == [(200, "")] * SLOTS, others
        with httpx.Client(timeout=30) as client:
            still = chat(client, g3, scene.key, scene.fast, "b-still-cut")
        assert (still.status, still.code) == (503, "policy_stale")
    finally:
        third.heal()
        for thread in holders:
            thread.join()

    # AND healed, g3 serves again
    with httpx.Client(timeout=30) as client:
        assert wait_until(
            lambda: chat(client, g3, scene.key, scene.fast, "b-healed").status == 200,
            timeout=30,
        )
    assert all(process.alive() for process in scene.processes.values())


def _state(scene: Scene) -> str:
    """The slow pool's keys and the gateways' logs: why capacity did not come back."""
    setup = scene.setup
    pool = keys.pool_prefix(scene.slow)
    node = scene.cluster.owner_of(pool).client()
    lines = [f"TIME {node.time()}", f"pools {setup.smembers(keys.pools())}"]
    for name in node.keys(pool + "*"):
        kind = node.type(name)
        value: object = (
            node.zrange(name, 0, -1, withscores=True) if kind == b"zset"
            else node.hgetall(name) if kind == b"hash" else kind
        )  # fmt: skip
        lines.append(f"{name!r} {str(value)[:300]}")
    fast_gws = keys.gateways(scene.fast)
    lines.append(f"fast gws {scene.setup.zrange(fast_gws, 0, -1, withscores=True)}")
    for name in ("g1", "g2"):
        lines.append(scene.processes[name].log_tail(15))
    return "\n".join(lines)
