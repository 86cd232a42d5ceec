"""One capacity enforced across separate OS processes sharing one Valkey."""

from __future__ import annotations

import subprocess
import sys

import orjson

from gateway.scheduling import fleet_entry, keys, wall_ms
from ops.processes import REPO_ROOT
from tests.gateway.scheduling.conftest import MODEL, R1, R2

CAPS = {R1: 2, R2: 3}
WORKERS = 3
REQUESTS = 120


def test_separate_gateway_processes_never_exceed_the_caps(valkey_client, valkey_url):
    """GIVEN three processes, each with its own Scheduler, and two replicas with caps 2 and 3,
    WHEN each pushes 120 requests of mixed ranks, tenants and sizes through at once, THEN no
    replica ever holds more than its cap, every request is served, and nothing stays held."""
    now = wall_ms()
    valkey_client.hset(
        keys.fleet(MODEL),
        mapping={
            url: fleet_entry(waiting=0, running=0, kv_usage=0.0, scraped_at_ms=now) for url in CAPS
        },
    )
    valkey_client.set("test:workers", WORKERS)
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.gateway.scheduling.capacity_worker",
                valkey_url,
                f"proc-{n}",
                str(REQUESTS),
                orjson.dumps(CAPS).decode(),
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in range(WORKERS)
    ]
    summaries = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=45)
        finally:
            process.kill()
        assert process.returncode == 0, err.decode()[-2000:]
        summaries.append(orjson.loads(out.splitlines()[-1]))

    assert [s["violations"] for s in summaries] == [0] * WORKERS
    assert sum(s["granted"] for s in summaries) == WORKERS * REQUESTS
    # Real contention: the fuller replica was seen at exactly its cap, never above.
    assert max(s["peak"] for s in summaries) == max(CAPS.values())
    assert valkey_client.hgetall(keys.in_flight(MODEL)) == {}
    assert valkey_client.zcard(keys.leases(MODEL)) == 0
    assert valkey_client.zcard(keys.queue(MODEL)) == 0
