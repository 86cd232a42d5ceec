"""The live fleet view's reader against a real Valkey, with every key written by its real
writer: the policy snapshot as governance publishes it, the fleet hashes as the watcher
writes them (``write_fleet`` / ``fleet_entry``), grants, leases and the queue by the
scheduling scripts themselves (``acquire.lua``), and the accounting streams by the gateway's
``Accounting`` writer.

GIVEN a model with a replica that has room, one whose vLLM queue is at the threshold, one the
watcher could not reach and one it has not written yet; two requests granted and two waiting
(one per class); and a second of accounting entries
WHEN the publisher's reader reads the fleet twice around those entries
THEN each replica, class and rate is what those writers wrote, and the next tick does not
count the same entries again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import valkey
import valkey.asyncio as avalkey

from gateway.accounting import Accounting, Decision
from gateway.fleet_watcher import ReplicaLoad
from gateway.scheduling import fleet_entry, keys, saturated_entry, write_fleet
from portal.fleet.messages import FleetSnapshot
from portal.fleet.reader import FleetReader
from testkit.policy import PolicyBuilder
from tests.gateway.scheduling.conftest import Lua

MODEL = "llama"
R1, R2, R3, R4, R5 = (f"http://10.0.0.{n}:8000" for n in (1, 2, 3, 4, 5))


def _valkey_ms(client: valkey.Valkey) -> int:
    seconds, micros = client.time()  # type: ignore[misc]
    return int(seconds) * 1000 + int(micros) // 1000


def _publish_policy(client: valkey.Valkey) -> None:
    policy = PolicyBuilder().model(MODEL, [R1, R2, R3, R4, R5])
    policy.priority_class("prod", rank=1).priority_class("batch", rank=5, max_pool_share=0.5)
    policy.key()
    policy.publish(client)


async def _write_fleet(url: str, now: int) -> None:
    client = avalkey.Valkey.from_url(url)
    try:
        await write_fleet(
            client,
            MODEL,
            {
                R1: fleet_entry(
                    waiting=0, running=4, kv_usage=0.25, scraped_at_ms=now, in_flight=0,
                    max_running=16,
                ),
                R2: fleet_entry(waiting=5, running=8, kv_usage=0.9, scraped_at_ms=now),
                R3: ReplicaLoad.unreachable(now).encode(),  # the watcher: no answer
                R5: saturated_entry(scraped_at_ms=now),  # a gateway: connect failed
            },
        )  # fmt: skip
    finally:
        await client.aclose()


async def _write_accounting(url: str) -> None:
    client = avalkey.Valkey.from_url(url)
    accounting = Accounting(client, flush_interval_s=0.01)
    await accounting.start()
    common: dict[str, Any] = {"tenant": "acme", "use_case_id": 1, "key_id": 1, "model": MODEL}
    for number in range(3):
        accounting.record_usage(
            request_id=f"ok-{number}", replica=R1, status=200, prompt_tokens=10,
            completion_tokens=20, queued_ms=0, upstream_ms=5, total_ms=6, policy_version=1,
            **common,
        )  # fmt: skip
    decisions: tuple[tuple[Decision, str], ...] = (
        ("rejected", "rate_limit:acme-rpm"),
        ("rejected", "queue_full"),
        ("shed", "queue_timeout"),
        ("queued", "prod"),
        ("fallback", "queue_timeout:llama-small"),
    )
    for decision, reason in decisions:
        accounting.record_decision(
            request_id=f"d-{reason}", decision=decision, reason=reason, policy_version=1,
            wait_ms=120, **common,
        )  # fmt: skip
    await accounting.close()
    await client.aclose()


def test_reader_shows_what_the_watcher_scheduler_and_gateway_wrote(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    _publish_policy(valkey_client)
    now = _valkey_ms(valkey_client)
    asyncio.run(_write_fleet(valkey_url, now))
    lua = Lua(valkey_client)
    replicas = ((R1, 2), (R2, 2), (R3, 2), (R4, 2), (R5, 2))
    # Two granted (R1 is the only replica with room), then two wait: one per class.
    granted = [
        lua.acquire(now - 2000, "a", priority_class="prod", rank=1, replicas=replicas),
        lua.acquire(
            now - 2000, "d", priority_class="batch", rank=5, pool_share=500, replicas=replicas
        ),
    ]
    assert all(reply[0] == 1 for reply in granted), granted
    waiting = [
        lua.acquire(now - 1500, "b", priority_class="prod", rank=1, replicas=replicas),
        lua.acquire(
            now - 700, "c", priority_class="batch", rank=5, pool_share=500, replicas=replicas
        ),
    ]
    assert all(reply[0] == 0 for reply in waiting), waiting

    async def scenario() -> tuple[FleetSnapshot, FleetSnapshot, FleetSnapshot]:
        client = avalkey.Valkey.from_url(valkey_url)
        reader = FleetReader(client)
        try:
            before = await reader.read()
            await _write_accounting(valkey_url)
            await asyncio.sleep(0.01)
            during = await reader.read()
            await asyncio.sleep(0.01)
            after = await reader.read()
        finally:
            await client.aclose()
        return before, during, after

    before, during, after = asyncio.run(scenario())

    assert before["policy_version"] is not None
    [model] = during["models"]
    assert model["model"] == MODEL
    assert (model["leases"], model["queued"]) == (2, 2)
    rows = {row["replica"]: row for row in model["replicas"]}
    assert list(rows) == [R1, R2, R3, R4, R5]  # the policy's order
    assert rows[R1]["running"] == 4
    assert rows[R1]["kv_usage"] == 0.25
    assert rows[R1]["in_flight"] == 2
    # The scheduler's cap: the policy's 64, lowered to the learned batch size + threshold.
    assert rows[R1]["cap"] == 16 + 3
    assert rows[R1]["full"] is False
    assert rows[R1]["reachable"] is True
    assert rows[R1]["saturated"] is False  # age under the bound: the test is fresh enough
    assert rows[R2]["waiting"] == 5
    assert rows[R2]["saturated"] is True  # vLLM's queue at or over the threshold (3)
    assert (rows[R3]["reachable"], rows[R3]["saturated"], rows[R3]["running"]) == (
        False,
        True,
        None,
    )
    assert (rows[R4]["age_ms"], rows[R4]["saturated"]) == (None, True)  # never scraped
    assert (rows[R5]["reachable"], rows[R5]["saturated"]) == (False, True)

    classes = {row["priority_class"]: row for row in model["classes"]}
    assert [row["priority_class"] for row in model["classes"]] == ["prod", "batch"]  # by rank
    assert classes["prod"]["depth"] == 1
    assert classes["batch"]["depth"] == 1
    read_at = during["at_ms"]
    assert classes["prod"]["oldest_wait_ms"] == read_at - (now - 1500)
    assert classes["batch"]["oldest_wait_ms"] == read_at - (now - 700)
    assert classes["batch"]["in_flight"] == 1  # "d", counted in cif: for its pool share
    assert classes["prod"]["in_flight"] is None  # no pool share: not counted there
    # One model: the fleet-wide view of each class is that model's.
    assert during["classes"] == model["classes"]

    assert before["rates"]["admitted"] == 0
    rates = during["rates"]
    window = rates["window_s"]
    assert 0 < window < 5
    assert rates["admitted"] == round(3 / window, 2)
    assert rates["refused"] == round(2 / window, 2)
    assert rates["shed"] == round(1 / window, 2)
    assert rates["queued"] == round(1 / window, 2)
    assert rates["fallbacks"] == round(1 / window, 2)
    assert rates["tokens"] == round(90 / window, 1)
    assert rates["completion_tokens"] == round(60 / window, 1)
    assert rates["capped"] is False
    assert during["per_model"][MODEL]["refused"] == rates["refused"]
    # The next tick starts where this one ended: nothing is counted twice.
    assert after["rates"]["admitted"] == 0
    assert after["rates"]["refused"] == 0
    assert after["per_model"] == {}


def test_rates_are_marked_lower_bounds_past_the_cap(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    _publish_policy(valkey_client)

    async def scenario() -> FleetSnapshot:
        client = avalkey.Valkey.from_url(valkey_url)
        reader = FleetReader(client, stream_cap=2)
        try:
            await reader.read()
            await _write_accounting(valkey_url)
            await asyncio.sleep(0.01)
            return await reader.read()
        finally:
            await client.aclose()

    snapshot = asyncio.run(scenario())
    assert snapshot["rates"]["capped"] is True
    window = snapshot["rates"]["window_s"]
    assert snapshot["rates"]["admitted"] == round(2 / window, 2)  # the first two entries read


def test_an_empty_valkey_reads_as_an_empty_fleet(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    async def scenario() -> FleetSnapshot:
        client = avalkey.Valkey.from_url(valkey_url)
        try:
            return await FleetReader(client).read()
        finally:
            await client.aclose()

    started = time.time() * 1000
    snapshot = asyncio.run(scenario())
    assert snapshot["models"] == []
    assert snapshot["policy_version"] is None
    assert abs(snapshot["at_ms"] - started) < 5_000  # Valkey's clock, in milliseconds


def test_queues_by_class_add_every_models_waiters_and_keep_the_longest_wait(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    """GIVEN two models whose only replicas are saturated, with waiters of both classes
    WHEN the reader reads the fleet
    THEN each class's fleet-wide depth is the sum over the models and its oldest wait the
    longest of any model's."""
    other = "mistral"
    policy = PolicyBuilder().model(MODEL, [R1]).model(other, [R2])
    policy.priority_class("prod", rank=1).priority_class("batch", rank=5)
    policy.key()
    policy.publish(valkey_client)
    now = _valkey_ms(valkey_client)
    busy = fleet_entry(waiting=5, running=8, kv_usage=0.9, scraped_at_ms=now)
    valkey_client.hset(keys.fleet(MODEL), mapping={R1: busy})
    valkey_client.hset(keys.fleet(other), mapping={R2: busy})
    lua = Lua(valkey_client)
    for at, request, model, cls, rank, replica in (
        (now - 3000, "p1", MODEL, "prod", 1, R1),
        (now - 1000, "b1", MODEL, "batch", 5, R1),
        (now - 500, "p2", other, "prod", 1, R2),
        (now - 400, "p3", other, "prod", 1, R2),
    ):
        reply = lua.acquire(
            at, request, model=model, priority_class=cls, rank=rank, replicas=((replica, 2),)
        )
        assert reply[0] == 0, reply  # queued: the replica is saturated

    async def scenario() -> FleetSnapshot:
        client = avalkey.Valkey.from_url(valkey_url)
        try:
            return await FleetReader(client).read()
        finally:
            await client.aclose()

    snapshot = asyncio.run(scenario())
    fleet = {row["priority_class"]: row for row in snapshot["classes"]}
    assert [row["priority_class"] for row in snapshot["classes"]] == ["prod", "batch"]
    assert fleet["prod"]["depth"] == 3
    assert fleet["prod"]["oldest_wait_ms"] == snapshot["at_ms"] - (now - 3000)
    assert fleet["batch"]["depth"] == 1
    assert fleet["batch"]["oldest_wait_ms"] == snapshot["at_ms"] - (now - 1000)
    by_model = {row["model"]: row for row in snapshot["models"]}
    assert by_model[other]["queued"] == 2
    assert by_model[other]["replicas"][0]["saturated"] is True
    assert by_model[other]["replicas"][0]["cap"] == 64  # the policy's: no batch size learned


def test_a_replica_at_its_cap_is_full_though_vllms_queue_is_short(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    policy = PolicyBuilder().model(MODEL, [R1], max_in_flight_per_replica=2)
    policy.priority_class("prod", rank=1).key()
    policy.publish(valkey_client)
    now = _valkey_ms(valkey_client)
    valkey_client.hset(
        keys.fleet(MODEL),
        mapping={R1: fleet_entry(waiting=0, running=2, kv_usage=0.1, scraped_at_ms=now)},
    )
    lua = Lua(valkey_client)
    for request in ("a", "b"):
        assert lua.acquire(now, request, replicas=((R1, 2),))[0] == 1

    async def scenario() -> FleetSnapshot:
        client = avalkey.Valkey.from_url(valkey_url)
        try:
            return await FleetReader(client).read()
        finally:
            await client.aclose()

    [row] = asyncio.run(scenario())["models"][0]["replicas"]
    assert (row["in_flight"], row["cap"]) == (2, 2)
    assert row["full"] is True
    assert row["saturated"] is False
