"""The traffic split's arithmetic (gateway/policy.py ``SplitWheel``): exact shares over any
run of requests, interleaved, and a sticky key always on one version."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import orjson
import pytest

from gateway.policy import SplitWheel, parse_snapshot
from testkit.policy import PolicyBuilder


@pytest.mark.parametrize(
    "split",
    [
        (("v1", 95), ("v2", 5)),
        (("a", 1), ("b", 1), ("c", 1)),
        (("old", 7), ("new", 3)),
        # a cycle longer than the wheel keeps: picks worked out one by one
        tuple((f"v{n}", 1000 - n) for n in range(5)),
    ],
)
def test_every_run_of_requests_gets_each_version_within_one_request_of_its_share(
    split: tuple[tuple[str, int], ...],
) -> None:
    wheel = SplitWheel(split)
    total = sum(weight for _, weight in split)
    picks = [wheel.next() for _ in range(max(1_000, 2 * total + 250))]
    for start in (0, 13, 250):
        for length in (total, 97, 500):
            window = Counter(picks[start : start + length])
            for name, weight in split:
                assert abs(window[name] - length * weight / total) <= 1.0 + 1e-9, (
                    name,
                    start,
                    length,
                    window,
                )


def test_a_small_share_is_spread_out_not_sent_in_a_burst() -> None:
    wheel = SplitWheel((("v1", 95), ("v2", 5)))
    picks = [wheel.next() for _ in range(200)]
    places = [i for i, name in enumerate(picks) if name == "v2"]
    assert len(places) == 10
    assert all(later - earlier == 20 for earlier, later in pairwise(places))


def test_a_sticky_key_always_gets_one_version_and_keys_spread_by_weight() -> None:
    wheel = SplitWheel((("v1", 50), ("v2", 50)))
    assert len({wheel.by_hash("chat:7") for _ in range(10)}) == 1
    spread = Counter(wheel.by_hash(f"chat:{use_case}") for use_case in range(2_000))
    assert 900 <= spread["v1"] <= 1_100, spread


def snapshot(policy: PolicyBuilder) -> bytes:
    document = {"schema": 1, "version": 1, "models": policy.models, "keys": {}}
    return orjson.dumps(document)


def test_a_snapshot_with_versions_parses_into_pools_and_a_routing() -> None:
    policy = PolicyBuilder()
    policy.versions("chat", {"v1": ["http://a"], "v2": ["http://b"]}, split={"v1": 9, "v2": 1},
                    aliases={"stable": "v1"})  # fmt: skip
    parsed = parse_snapshot(snapshot(policy))
    chat = parsed.models["chat"]
    assert chat.replicas == ("http://a", "http://b")  # for gateways from before versions
    assert chat.routing is not None
    assert chat.routing.target("stable") == "v1"
    assert chat.routing.target("v2") == "v2"
    assert chat.routing.target("v3") is None
    v2 = parsed.models["chat@v2"]
    assert (v2.base, v2.version, v2.replicas) == ("chat", "v2", ("http://b",))
    assert (b"x-switchyard-model-version", b"v2") in v2.notices


def test_a_split_without_a_positive_weight_is_refused() -> None:
    policy = PolicyBuilder()
    policy.versions("chat", {"v1": ["http://a"]})
    policy.models["chat"]["routing"]["split"] = []
    with pytest.raises(ValueError, match="split"):
        parse_snapshot(snapshot(policy))
