"""Fixtures for the multi-host tests: hosts as network namespaces (tests/support/netns.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

from tests.support.netns import NetnsUnavailable, Network

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
