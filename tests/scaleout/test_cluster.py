"""The gateway on a Valkey Cluster of three primaries (docs/valkey-ha.md): it admits and
relays a chat, with every admission key under one hash tag (so on one shard), and its usage
record reaches the stream on whichever shard owns that stream's slot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import pytest
import valkey
from valkey.cluster import ValkeyCluster

from config.env import ConfigurationError
from config.processes import wait_until
from config.valkey_urls import for_channels, for_kombu, sync_client
from gateway.accounting import USAGE_STREAM
from tests.support.policy import PolicyBuilder
from tests.support.valkey_ha import ClusterSet

CHAT = "llama-cluster"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterSet]:
    nodes = ClusterSet(tmp_path / "cluster")
    try:
        yield nodes.start()
    finally:
        nodes.stop()


def test_the_gateway_admits_and_relays_a_chat_through_a_cluster(
    cluster: ClusterSet, start_simulator, start_gateway
) -> None:
    sim = start_simulator(CHAT, "--time-scale", "0")
    policy = PolicyBuilder().model(CHAT, [sim.base_url])
    key = policy.key()
    client = sync_client(cluster.url)
    policy.publish(client)
    gateway = start_gateway(valkey=cluster.url)

    responses = [
        httpx.post(
            gateway.base_url + "/v1/chat/completions",
            json={"model": CHAT, "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {key}", "X-Request-Id": f"cluster-{n}"},
            timeout=30,
        )
        for n in range(5)
    ]
    assert [r.status_code for r in responses] == [200] * 5, responses[-1].text
    assert responses[0].json()["choices"][0]["message"]["content"]

    # The keys really are spread over the shards: the admission keys on {sy}'s node…
    nodes = cast(ValkeyCluster, client)
    sy_node = valkey.Valkey(port=nodes.get_node_from_key("{sy}").port)
    stream_node = valkey.Valkey(port=nodes.get_node_from_key(USAGE_STREAM).port)
    assert sy_node.keys("sy:{sy}:*")
    assert stream_node.exists(USAGE_STREAM)

    # …and the usage stream, in another slot, got every request's record.
    def recorded() -> set[str]:
        return {f[b"request_id"].decode() for _, f in client.xrange(USAGE_STREAM)}

    assert wait_until(lambda: {f"cluster-{n}" for n in range(5)} <= recorded(), timeout=10)


def test_celery_and_channels_refuse_a_cluster_url_naming_their_own_setting() -> None:
    url = "valkey+cluster://127.0.0.1:7000,127.0.0.1:7001"
    with pytest.raises(ConfigurationError, match="SWITCHYARD_CELERY_BROKER_URL"):
        for_kombu(url)
    with pytest.raises(ConfigurationError, match="SWITCHYARD_CHANNELS_VALKEY_URL"):
        for_channels(url)
