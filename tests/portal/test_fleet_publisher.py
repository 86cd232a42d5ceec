"""The fleet publisher: one at a time, however many run (a standby, two stacks on one
Valkey), and a standby takes over when the publisher stops. Real Valkey, real processes, the
real channel layer (channels_valkey) as the web processes use it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import valkey
import valkey.asyncio as avalkey
from channels_valkey.core import ValkeyChannelLayer

from ops.processes import PYTHON, ManagedProcess
from portal.fleet.leader import LEADER_KEY, Leadership
from portal.fleet.messages import GROUP
from testkit.policy import PolicyBuilder

INTERVAL_S = 0.3


def test_one_lease_holder_at_a_time_and_a_standby_takes_over(
    valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    """The lease's time passing is played by shortening its TTL (PEXPIRE), so that a loaded
    machine's late wake-ups cannot decide the outcome (sleeps against a 300 ms lease did)."""

    async def scenario() -> None:
        client = avalkey.Valkey.from_url(valkey_url)
        first, second = Leadership(client, ttl_ms=60_000), Leadership(client, ttl_ms=60_000)
        try:
            assert await first.hold() is True
            assert await second.hold() is False
            await client.pexpire(LEADER_KEY, 5_000)  # most of its lease gone
            assert await first.hold() is True  # renewed, to the whole TTL
            assert await client.pttl(LEADER_KEY) > 5_000
            assert await second.hold() is False
            await client.pexpire(LEADER_KEY, 1)  # the holder stopped renewing: it runs out
            await asyncio.sleep(0.01)
            assert await second.hold() is True
            assert await first.hold() is False
            await first.release()  # not its lease: nothing happens
            assert await second.hold() is True
            await second.release()
            assert await client.get(LEADER_KEY) is None  # handed over at once
            assert await first.hold() is True
        finally:
            await client.aclose()

    asyncio.run(scenario())


def _publisher(valkey_url: str, run_dir: Path) -> ManagedProcess:
    process = ManagedProcess(
        "fleet-publisher",
        [PYTHON, "-m", "portal.fleet.publisher"],
        env={
            "SWITCHYARD_VALKEY_URL": valkey_url,
            "SWITCHYARD_RUN_DIR": str(run_dir),
            "SWITCHYARD_FLEET_PUBLISH_INTERVAL_SECONDS": str(INTERVAL_S),
        },
    )
    process.start(ready=lambda: "fleet_publisher_started" in process.log_text(), timeout=60)
    return process


async def _ticks(layer: ValkeyChannelLayer, channel: str, seconds: float) -> list[int]:
    """The ``at_ms`` of every snapshot the group got for ``seconds``."""
    seen: list[int] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            message = await asyncio.wait_for(layer.receive(channel), left)
        except TimeoutError:
            break
        seen.append(message["snapshot"]["at_ms"])
    return seen


def test_two_publishers_send_one_snapshot_a_tick_and_the_standby_takes_over(
    valkey_client: valkey.Valkey, valkey_url: str, tmp_path: Path
) -> None:
    """GIVEN two publishers on one Valkey
    WHEN a page's channel listens to the group for a few seconds
    THEN it gets one snapshot per tick (not two); when the publishing one stops, the other
    carries on within a few ticks."""
    PolicyBuilder().model("sim-chat", ["http://10.2.0.1:8000"]).publish(valkey_client)
    publishers = [_publisher(valkey_url, tmp_path), _publisher(valkey_url, tmp_path)]
    try:

        async def scenario() -> tuple[list[int], list[int]]:
            layer = ValkeyChannelLayer(hosts=[valkey_url])
            channel = await layer.new_channel()
            await layer.group_add(GROUP, channel)
            try:
                await _ticks(layer, channel, INTERVAL_S * 4)  # both have started
                both = await _ticks(layer, channel, INTERVAL_S * 10)
                leader = next(p for p in publishers if "fleet_publisher_leading" in p.log_text())
                await asyncio.to_thread(leader.stop)
                after = await _ticks(layer, channel, INTERVAL_S * 12)
                return both, after
            finally:
                await layer.group_discard(GROUP, channel)
                await layer.flush()

        both, after = asyncio.run(scenario())
    finally:
        for publisher in publishers:
            publisher.stop()

    gaps = [b - a for a, b in itertools.pairwise(both)]
    assert 6 <= len(both) <= 12, both  # ~10 ticks, not ~20
    assert min(gaps) >= INTERVAL_S * 1000 * 0.5, gaps  # no second publisher between ticks
    assert len(after) >= 4, after  # the standby took over (lease: 3 ticks)
    assert after == sorted(after)
