"""The gateway on Valkey Sentinel: a primary killed mid-load fails over, admissions go on,
and no usage record of a request answered 200 is lost (docs/valkey-ha.md).

Why the usage records survive: the gateway's accounting writer is configured to wait for a
replica (``SWITCHYARD_GATEWAY_USAGE_WAIT_REPLICAS=1``): a batch leaves its buffer only once
the replica has it, so the replica the sentinels promote has every record the gateway let
go of, and what it had not let go of is written again to the new primary."""

from __future__ import annotations

import itertools
import time
from typing import cast

import httpx
import pytest
import valkey
from django.db.models import F, Sum

from gateway.accounting import USAGE_STREAM
from ops.processes import wait_until
from records.models import UsageMinute
from records.usage import usage_persist
from runtime.valkey_urls import sync_client
from testkit.client_threads import ClientThreads
from testkit.policy import PolicyBuilder
from testkit.valkey_ha import SentinelSet

CHAT = "llama-ha"
pytestmark = pytest.mark.django_db


def dump_state(client: valkey.Valkey) -> str:
    """The scheduling keys on the primary: why admissions did not resume, if they did not."""
    out = []
    v: object
    for k in sorted(key.decode() for key in cast(list[bytes], client.keys("sy:{sy}:*"))):
        t = client.type(k)
        if t == b"hash":
            v = client.hgetall(k)
        elif t == b"zset":
            v = client.zrange(k, 0, -1, withscores=True)
        elif t == b"string":
            v = client.get(k)
        else:
            v = t
        out.append(f"{k} {str(v)[:300]}")
    out.append(f"TIME {client.time()}")
    return "\n".join(out)


class Load(ClientThreads):
    """Clients sending chat completions, each with its own request id, until stopped."""

    def __init__(self, base_url: str, key: str, clients: int = 4) -> None:
        super().__init__(clients)
        self.base_url = base_url
        self.key = key
        self.ids = itertools.count()
        # (request id, status, error code, when it was sent: time.monotonic())
        self.results: list[tuple[str, int, str, float]] = []

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stopping.is_set():
                request_id = f"ha-{next(self.ids)}"
                sent = time.monotonic()
                response = client.post(
                    self.base_url + "/v1/chat/completions",
                    json={"model": CHAT, "messages": [{"role": "user", "content": "hi"}]},
                    headers={"Authorization": f"Bearer {self.key}", "X-Request-Id": request_id},
                )
                code = "" if response.status_code == 200 else response.json()["error"]["code"]
                self.results.append((request_id, response.status_code, code, sent))

    def answered(self) -> list[str]:
        return [rid for rid, status, _, _ in list(self.results) if status == 200]


def test_a_killed_primary_fails_over_and_no_answered_requests_usage_is_lost(
    sentinel_set: SentinelSet, start_simulator, start_gateway
) -> None:
    sim = start_simulator(CHAT, "--time-scale", "0")
    policy = PolicyBuilder().model(CHAT, [sim.base_url])
    # A request queued on the old primary at the kill may have a waiter the replica never
    # got: it is told at its next poll (503 queue_lost); one that queued before the fleet
    # figures were back waits out its class's queue timeout (a 503), short here.
    policy.priority_class("interactive", rank=0, queue_timeout_s=3)
    key = policy.key(priority_class="interactive")
    client = sync_client(sentinel_set.url)
    policy.publish(client)
    gateway = start_gateway(
        valkey=sentinel_set.url,
        SWITCHYARD_GATEWAY_USAGE_WAIT_REPLICAS="1",
        # The leases of requests in flight at the kill cannot be released (their release
        # met no primary): the reaper reclaims them at lease expiry, short here.
        SWITCHYARD_GATEWAY_LEASE_SECONDS="2",
    )

    with Load(gateway.base_url, key) as load:
        # GIVEN admissions flowing through the Sentinel-managed primary
        assert wait_until(lambda: len(load.answered()) >= 50, timeout=30)
        # WHEN the primary is killed mid-load
        old = sentinel_set.kill_primary()
        before_kill = len(load.results)
        new = sentinel_set.wait_failover(old)
        # (and comes back, as an orchestrator restarts it: the sentinels make it a replica
        # of the new primary, so that writes waiting for a replica can complete)
        sentinel_set.restart_as_replica(old, new)
        # The failover has ended once the old primary is back as a replica: until then a
        # gateway may still be talking to it (a place queued there is lost when it rejoins).
        failed_over = time.monotonic()
        # THEN admissions continue on the new primary
        after = len(load.results)
        assert wait_until(
            lambda: sum(r[1] == 200 for r in load.results[after:]) >= 50, timeout=30
        ), dump_state(client)
    # Refusals are the failover's clear 503s, nothing else: "Valkey unavailable" while there
    # is no primary, and a lost place or a queue timeout only for a request sent before the
    # failover ended.
    refused = {(status, code, sent < failed_over) for _, status, code, sent in load.results}
    assert refused - {(200, "", True), (200, "", False)} <= {
        (503, "admission_unavailable", True),
        (503, "admission_unavailable", False),
        (503, "queue_timeout", True),
        (503, "queue_lost", True),
    }, refused
    answered = load.answered()
    assert before_kill < len(load.results)

    # AND every request answered 200 has its usage record on the new primary…
    def recorded() -> set[str]:
        entries = client.xrange(USAGE_STREAM)
        return {fields[b"request_id"].decode() for _, fields in entries}

    assert wait_until(lambda: set(answered) <= recorded(), timeout=30), (
        f"{len(set(answered) - recorded())} answered requests have no usage record"
    )
    # …and persisted: the roll-ups count at least every 200 (a batch the old primary took
    # but had not confirmed replicating is written again: at-least-once, docs/valkey-ha.md).
    usage_persist(client=client, consumer="ha")
    totals = UsageMinute.objects.filter(model=CHAT).aggregate(ok=Sum(F("requests") - F("errors")))
    assert totals["ok"] >= len(answered)
