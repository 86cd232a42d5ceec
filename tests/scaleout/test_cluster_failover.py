"""The hot path's Cluster pipeline (gateway/autopipeline.py, ``ClusterAutoPipeline``) follows
a failover on its own: a primary killed under it fails the calls on their way with
``valkey.ConnectionError`` (the gateway's 503 ``admission_unavailable``), never a hang, and
once its replica is promoted the calls go there — the pipeline re-reads the slot map after
a failed connection, without waiting for some other client of the process to do it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest
import valkey
from valkey.asyncio.cluster import ValkeyCluster

from gateway.autopipeline import ClusterAutoPipeline, auto_pipeline
from gateway.policy_store import PolicyStore
from ops.processes import wait_until
from runtime.valkey_urls import async_client, sync_client
from testkit.policy import PolicyBuilder
from testkit.valkey_ha import ClusterSet

INCR = "return redis.call('INCR', KEYS[1])"


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[ClusterSet]:
    cluster = ClusterSet(tmp_path / "cluster", replicas=1, node_timeout_ms=1000)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def test_a_killed_primary_fails_calls_closed_then_the_pipeline_follows_its_replica(
    replicated: ClusterSet,
) -> None:
    """GIVEN a script counting on a key whose primary has a replica on another node
    WHEN that primary is killed while calls keep coming
    THEN every call either counts or fails with ConnectionError (none hangs, none gets
    another error), and once the replica is promoted the calls count again on it, with
    the count the replica had; a key-less command finds a primary though valkey-py has
    dropped its default node."""
    key = "{pool-a}:count"
    primary = replicated.owner_of(key)

    async def scene() -> tuple[int, list[str], int]:
        client = async_client(replicated.url)
        pipe = auto_pipeline(client, reply_timeout_s=1.0)
        assert isinstance(pipe, ClusterAutoPipeline)
        pipe.register("incr", INCR)
        try:
            for _ in range(20):
                await pipe.script("incr", [key], [])
            # (the 20 counts reach the replica before the kill)
            await pipe.execute("WAIT", 1, 1000)
            replicated.kill(primary)
            failures: list[str] = []
            promoted = asyncio.get_running_loop().run_in_executor(
                None, replicated.wait_failover, primary
            )
            counted = 0
            async with asyncio.timeout(30):
                while counted < 10:
                    try:
                        await pipe.script("incr", [key], [])
                    except valkey.ConnectionError:
                        failures.append("connection")
                        await asyncio.sleep(0.05)
                        continue
                    except valkey.ResponseError as exc:
                        failures.append(str(exc))
                        await asyncio.sleep(0.05)
                        continue
                    counted += 1
            await promoted
            total = int(await pipe.execute("GET", key))
            # A key-less command (TIME: the scheduler's clock) when valkey-py has no default
            # node: a failed re-initialisation of its client (valkey-py's own commands, in
            # the same process, during a failover) closes its nodes manager, which drops it.
            await cast(ValkeyCluster, client).nodes_manager.aclose()
            assert len(await pipe.execute("TIME")) == 2
            return counted, failures, total
        finally:
            await pipe.close()
            await client.aclose()

    counted, failures, total = asyncio.run(scene())
    assert counted == 10
    # While no primary owns the slot: the connection is refused, or a live node says the
    # slot is down (CLUSTERDOWN) — both "unavailable", both retried.
    assert {f for f in failures if f != "connection"} <= {
        f for f in failures if f.startswith("CLUSTERDOWN")
    }, failures
    assert failures, "the kill went unnoticed: the calls did not reach the killed primary"
    assert total == 30


def test_the_gateways_subscription_moves_on_when_the_first_listed_node_dies(
    replicated: ClusterSet,
) -> None:
    """GIVEN a subscription made from a Cluster URL (the scheduler's grants: on the first
    node listed, valkey.asyncio's Cluster client has no pub/sub of its own)
    WHEN that node is killed and its replica takes over
    THEN the subscription reconnects to another node of the URL and gets what is published
    there (a Cluster delivers a PUBLISH to every node), instead of knocking at the dead one."""
    first = replicated.primaries[0]

    async def scene() -> list[bytes]:
        client = async_client(replicated.url)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe("sy:gw:test")
        try:
            replicated.kill(first)
            await asyncio.get_running_loop().run_in_executor(None, replicated.wait_failover, first)
            publisher = replicated.primaries[1].client()
            received: list[bytes] = []
            async with asyncio.timeout(30):
                while not received:
                    publisher.publish("sy:gw:test", b"granted")
                    try:
                        message = await pubsub.get_message(timeout=0.5)
                    except valkey.ConnectionError:
                        await asyncio.sleep(0.1)
                        continue
                    if message is not None:
                        received.append(message["data"])
            return received
        finally:
            await pubsub.aclose()
            await client.aclose()

    assert asyncio.run(scene()) == [b"granted"]


def test_the_policy_refresh_outlives_a_cluster_with_no_node_reachable(tmp_path: Path) -> None:
    """GIVEN a gateway's policy store refreshing from a Cluster of three primaries
    WHEN every node is killed (the client, re-reading its slot map, reaches none: valkey-py
    raises ValkeyClusterException, which is no ValkeyError) and then restarted, empty
    THEN the refresh loop is still running and loads the policy published after the restart
    (before, that exception ended the loop, and the gateway went policy_stale for good)."""
    cluster = ClusterSet(tmp_path / "cluster").start()
    try:

        async def scene() -> tuple[int | None, int]:
            client = async_client(cluster.url)
            store = PolicyStore(client, refresh_s=0.1, max_staleness_s=60)
            running = asyncio.create_task(store.run())

            async def until(condition: Callable[[], bool]) -> None:
                async with asyncio.timeout(30):
                    # (polled: the store has no event to wait on)
                    while not (condition() or running.done()):  # noqa: ASYNC110
                        await asyncio.sleep(0.05)
                assert not running.done(), running.exception()

            try:
                policy = PolicyBuilder().model("llama", ["http://127.0.0.1:1"])
                policy.publish(sync_client(cluster.url))
                before = policy.publish(sync_client(cluster.url))  # version 2
                await until(lambda: store.version == before)
                for node in cluster.nodes:
                    cluster.kill(node)
                await asyncio.sleep(2)  # refreshes meet no node
                assert not running.done(), running.exception()
                for node in cluster.nodes:
                    cluster.restart(node)
                assert wait_until(lambda: _cluster_ok(cluster), 30)
                # Restarted empty: the version counter starts again (1), another snapshot.
                after = policy.publish(sync_client(cluster.url))
                assert after != before
                await until(lambda: store.version == after)
                return store.version, after
            finally:
                store.stop()
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
                await client.aclose()

        loaded, published = asyncio.run(scene())
        assert loaded == published
    finally:
        cluster.stop()


def _cluster_ok(cluster: ClusterSet) -> bool:
    with contextlib.suppress(valkey.ValkeyError, OSError):
        return all(
            b"cluster_state:ok" in node.client().execute_command("CLUSTER", "INFO")
            for node in cluster.nodes
        )
    return False
