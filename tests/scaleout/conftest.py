"""Fixtures for the scale-out tests: hosts as network namespaces (testkit/netns.py),
a Valkey Cluster on loopback, and the batchers a test starts."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from ops.processes import ManagedProcess
from testkit.netns import NetnsUnavailable, Network
from testkit.valkey_ha import ClusterSet, SentinelSet

NetworkFactory = Callable[[Sequence[str]], Network]


@pytest.fixture
def hosts() -> Iterator[NetworkFactory]:
    """``hosts(["valkey", "gateway", ...])`` → a ``Network``; torn down whatever happens.
    Fails (never skips) where namespaces cannot be made, naming the missing capability."""
    made: list[Network] = []

    def make(names: Sequence[str]) -> Network:
        try:
            network = Network(names)
        except NetnsUnavailable as exc:
            pytest.fail(f"the multi-host tests need network namespaces: {exc}", pytrace=False)
        made.append(network)
        return network

    try:
        yield make
    finally:
        for network in made:
            network.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterSet]:
    """A Valkey Cluster of three primaries on loopback, for one test."""
    nodes = ClusterSet(tmp_path / "cluster")
    try:
        yield nodes.start()
    finally:
        nodes.stop()


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    """A primary, its replica and three sentinels on loopback, for one test."""
    valkeys = SentinelSet(tmp_path / "sentinel")
    try:
        yield valkeys.start()
    finally:
        for node in valkeys.data.values():  # a test that failed with a node stopped (SIGSTOP)
            node.signal(signal.SIGCONT)
        valkeys.stop()


@pytest.fixture
def batchers() -> Iterator[list[ManagedProcess]]:
    """Batcher processes a test starts (append them): stopped when it ends."""
    started: list[ManagedProcess] = []
    try:
        yield started
    finally:
        for process in started:
            process.stop()
