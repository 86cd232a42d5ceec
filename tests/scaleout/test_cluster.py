"""The gateway on a Valkey Cluster of three primaries (docs/valkey-ha.md,
docs/gateway-scheduling.md "Scale-out"): admission spread over the shards — each model pool's
keys on its slot's primary, a use case's limits on its tenant's — with the limits exact across
pools, and usage records on whichever primary owns the stream."""

from __future__ import annotations

from typing import Any, cast

import httpx
import pytest
import valkey
from valkey.cluster import ValkeyCluster

from gateway.accounting import USAGE_STREAM
from gateway.scheduling import keys
from ops.processes import wait_until
from runtime.env import ConfigurationError
from runtime.valkey_urls import for_channels, for_kombu, sync_client
from testkit.policy import PolicyBuilder
from testkit.valkey_ha import ClusterSet

CHAT = "llama-cluster"


def test_the_gateway_admits_over_three_shards_and_a_use_case_limit_holds_across_pools(
    cluster: ClusterSet, start_simulator, start_gateway
) -> None:
    """GIVEN a Cluster of three primaries, two models whose pools' slots are on different
    primaries, and a use case allowed 4 requests a minute, at most 2 at once, on both
    WHEN a gateway (split slots: the use case's account first, then the pool) gets 6 chats
    alternating between the models
    THEN 4 are answered and the 5th and 6th refused on the use case's limit; its count (4)
    is on the tenant's primary, each pool's keys on its own primary; and every answered
    request's usage record reaches the stream, on whichever primary owns it."""
    models = cluster.names_on_each_node("chat", 2, keys.pool_prefix)
    sim = start_simulator(CHAT, "--time-scale", "0")
    policy = PolicyBuilder()
    for model in models:
        policy.model(model, [sim.base_url], served_name=CHAT)
    key = policy.key(tenant="acme", models=models)
    policy.use_case_limits(key, requests_per_minute=4, max_concurrent=2)
    client = sync_client(cluster.url)
    policy.publish(client)
    gateway = start_gateway(valkey=cluster.url)

    responses = [
        httpx.post(
            gateway.base_url + "/v1/chat/completions",
            json={"model": models[n % 2], "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {key}", "X-Request-Id": f"cluster-{n}"},
            timeout=30,
        )
        for n in range(6)
    ]
    assert [r.status_code for r in responses] == [200] * 4 + [429] * 2, responses[-1].text
    assert responses[0].json()["choices"][0]["message"]["content"]
    assert "use case" in responses[4].json()["error"]["message"]

    nodes = cast(ValkeyCluster, client)

    def node_of(key_name: str) -> valkey.Valkey:
        return valkey.Valkey(port=nodes.get_node_from_key(key_name).port)

    tenant = node_of(keys.account_prefix("acme"))
    counted: Any = tenant.keys(keys.account_prefix("acme") + "rl:*:rpm:*")
    values: list[Any] = [tenant.get(name) for name in counted]
    assert [int(value or 0) for value in values] == [4]
    pool_nodes = {
        node_of(keys.pool_prefix(m)).connection_pool.connection_kwargs["port"] for m in models
    }
    assert len(pool_nodes) == 2  # the two pools really are on two primaries
    for model in models:
        found: Any = node_of(keys.pool_prefix(model)).exists(keys.pool(model), keys.fleet(model))
        assert found >= 1

    def recorded() -> set[str]:
        return {f[b"request_id"].decode() for _, f in client.xrange(USAGE_STREAM)}

    assert wait_until(lambda: {f"cluster-{n}" for n in range(4)} <= recorded(), timeout=10)


def test_celery_and_channels_refuse_a_cluster_url_naming_their_own_setting() -> None:
    url = "valkey+cluster://127.0.0.1:7000,127.0.0.1:7001"
    with pytest.raises(ConfigurationError, match="SWITCHYARD_CELERY_BROKER_URL"):
        for_kombu(url)
    with pytest.raises(ConfigurationError, match="SWITCHYARD_CHANNELS_VALKEY_URL"):
        for_channels(url)
