"""An async 202 survives a Sentinel failover (docs/valkey-ha.md, "Async 202s wait for a
replica"): with ``SWITCHYARD_GATEWAY_USAGE_WAIT_REPLICAS=1`` a submission is answered 202 only
once a replica has its tasks, so every task a client was told is queued is on the replica
the sentinels promote, and runs.

Valkey replicates asynchronously, and on one machine a replica is rarely more than a moment
behind; the test makes it lag for sure, as a slow or stalled replica would: the replica is
stopped (SIGSTOP) and the primary given writes until its replication buffer for the replica
holds some (what the kernel's socket buffers take would still reach the replica); the
primary is then killed with those writes — and the tasks submitted meanwhile — never sent.
Without the wait those tasks were answered 202 and are gone after the failover."""

from __future__ import annotations

import itertools
import signal
import time
from pathlib import Path
from typing import Any, cast

import httpx
import valkey

from ops.processes import ManagedProcess, wait_until
from runtime.valkey_urls import sync_client
from testkit.client_threads import ClientThreads
from testkit.policy import PolicyBuilder
from testkit.valkey_ha import SentinelSet, start_batcher_on

CHAT = "llama-async-ha"


class Submitter(ClientThreads):
    """Clients submitting async chats, one at a time each, until stopped."""

    def __init__(self, base_url: str, key: str, clients: int = 4) -> None:
        super().__init__(clients)
        self.base_url = base_url
        self.key = key
        self.numbers = itertools.count()
        # (status, task id or error code, when it was sent: time.monotonic())
        self.results: list[tuple[int, str, float]] = []

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stopping.is_set():
                text = f"task {next(self.numbers)}"
                sent = time.monotonic()
                try:
                    response = client.post(
                        self.base_url + "/v1/async/chat/completions",
                        json={"model": CHAT, "messages": [{"role": "user", "content": text}]},
                        headers={"Authorization": f"Bearer {self.key}"},
                    )
                except httpx.HTTPError as exc:  # never expected: the gateway stays up
                    self.results.append((0, repr(exc), sent))
                    continue
                found = response.json()
                outcome = found["id"] if response.status_code == 202 else found["error"]["code"]
                self.results.append((response.status_code, outcome, sent))

    def accepted(self, since: float = 0.0) -> list[str]:
        return [
            task for status, task, sent in list(self.results) if status == 202 and sent >= since
        ]

    def sent_since(self, since: float) -> int:
        return sum(sent >= since for _, _, sent in list(self.results))


def _hold_back_replication(primary: valkey.Valkey, replica: ManagedProcess) -> None:
    """Stop the replica and write to the primary until its buffer for the replica holds
    data: what is written from then on stays on the primary until the replica reads again."""
    replica.signal(signal.SIGSTOP)
    junk = b"x" * (1 << 20)

    def buffered() -> int:
        clients = cast(list[dict[str, Any]], primary.client_list(_type="replica"))
        return sum(int(c["omem"]) for c in clients)

    for n in range(60):  # far below the replica's output buffer limit (256 MB)
        primary.set(f"junk:{n}", junk)
        if buffered() > 0:
            return
    raise AssertionError("the primary never buffered replication for the stopped replica")


def test_every_task_answered_202_is_on_the_new_primary_after_a_failover_and_runs(
    sentinel_set: SentinelSet, start_simulator, start_gateway, batchers, tmp_path: Path
) -> None:
    """GIVEN a gateway on Sentinel whose async 202s wait for one replica, and clients
    submitting async tasks all along
    WHEN the replica falls behind (stopped, the primary's writes to it held back), the
    primary is killed with writes the replica never got, and the replica is promoted
    THEN submissions were answered 202 before and after, and 503 meanwhile (not replicated,
    or Valkey unavailable), never anything else; and every task answered 202 is on the new
    primary and is run by a batcher started after the failover."""
    sim = start_simulator(CHAT, "--time-scale", "0")
    policy = PolicyBuilder().model(CHAT, [sim.base_url])
    key = policy.key(tenant="acme")
    client = sync_client(sentinel_set.url)
    policy.publish(client)
    gateway = start_gateway(
        valkey=sentinel_set.url,
        SWITCHYARD_GATEWAY_USAGE_WAIT_REPLICAS="1",
        SWITCHYARD_ASYNC_REPLICA_WAIT_MS="300",
        SWITCHYARD_GATEWAY_LEASE_SECONDS="2",
    )
    old = sentinel_set.primary_port()
    (replica_port,) = [port for port in sentinel_set.ports if port != old]

    with Submitter(gateway.base_url, key) as load:
        # GIVEN submissions accepted through the Sentinel-managed primary
        assert wait_until(lambda: len(load.accepted()) >= 20, timeout=30)
        # WHEN the replica falls behind…
        _hold_back_replication(valkey.Valkey(port=old), sentinel_set.data[replica_port])
        lagging = time.monotonic()
        assert wait_until(lambda: load.sent_since(lagging) >= 8, timeout=30)
        # …and the primary dies with what the replica never got
        assert sentinel_set.kill_primary() == old
        sentinel_set.data[replica_port].signal(signal.SIGCONT)
        new = sentinel_set.wait_failover(old)
        assert new == replica_port
        sentinel_set.restart_as_replica(old, new)
        # THEN submissions are accepted again, on the new primary
        failed_over = time.monotonic()
        assert wait_until(lambda: len(load.accepted(since=failed_over)) >= 20, timeout=30), (
            load.results[-5:]
        )

    outcomes = {(status, task if status != 202 else "") for status, task, _ in load.results}
    assert outcomes <= {
        (202, ""),
        (503, "async_not_replicated"),
        (503, "admission_unavailable"),
    }, outcomes
    accepted = load.accepted()

    batchers.append(start_batcher_on(sentinel_set.url, tmp_path / "batcher"))
    lost: list[str] = []
    for task_id in accepted:
        polled = httpx.get(
            f"{gateway.base_url}/v1/tasks/{task_id}?wait=30",
            headers={"Authorization": f"Bearer {key}"},
            timeout=40,
        )
        if polled.status_code == 404:
            lost.append(task_id)
            continue
        assert polled.status_code == 200, polled.text
        assert polled.json()["status"] == "done", polled.json()
    assert not lost, f"{len(lost)} of {len(accepted)} tasks answered 202 are gone: {lost[:5]}"


def test_a_submission_no_replica_confirms_is_a_503_naming_its_queued_tasks(
    valkey_client: valkey.Valkey, start_simulator, start_gateway
) -> None:
    """GIVEN a gateway whose async 202s wait for one replica, on a Valkey that has none
    WHEN a task is submitted
    THEN the answer is 503 async_not_replicated, which the SDKs do not retry on their own
    (a retry would queue the task twice), naming the task — queued on the primary all the
    same, as its owner can see by polling it."""
    sim = start_simulator(CHAT, "--time-scale", "0")
    policy = PolicyBuilder().model(CHAT, [sim.base_url])
    key = policy.key(tenant="acme")
    policy.publish(valkey_client)
    gateway = start_gateway(
        SWITCHYARD_GATEWAY_USAGE_WAIT_REPLICAS="1", SWITCHYARD_ASYNC_REPLICA_WAIT_MS="200"
    )
    auth = {"Authorization": f"Bearer {key}"}

    refused = httpx.post(
        gateway.base_url + "/v1/async/chat/completions",
        json={"model": CHAT, "messages": [{"role": "user", "content": "hi"}]},
        headers=auth,
        timeout=30,
    )

    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "async_not_replicated"
    assert refused.headers["x-should-retry"] == "false"
    assert refused.headers["retry-after"] == "1"
    (task_id,) = [
        word.rstrip(".,") for word in error["message"].split() if word.startswith("task_")
    ]
    polled = httpx.get(f"{gateway.base_url}/v1/tasks/{task_id}", headers=auth, timeout=30)
    assert polled.status_code == 200, polled.text
    assert polled.json()["status"] == "queued"
