"""Async tasks through a gateway on a Valkey Cluster of three primaries (docs/async.md,
docs/valkey-ha.md): submission charges the use case's limits on its tenant's primary
(account.lua), then queues the tasks on the streams' slot (submit.lua) — and gives the charge
back when the queue refuses, so a refused submission counts nothing.

Real processes throughout: three valkey-servers, a gateway, a fleet watcher, a batcher and
the vLLM simulator."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, cast

import httpx
import valkey
from valkey.cluster import ValkeyCluster

from gateway.async_tasks import layout
from gateway.scheduling import keys
from runtime.valkey_urls import sync_client
from testkit.policy import PolicyBuilder
from testkit.valkey_ha import ClusterSet, start_batcher_on

CHAT = "llama-async-cluster"


def _node_of(cluster_client: valkey.Valkey, key_name: str) -> valkey.Valkey:
    node = cast(ValkeyCluster, cluster_client).get_node_from_key(key_name)
    return valkey.Valkey(port=node.port)


def _tenant_apart(cluster: ClusterSet, model: str) -> str:
    """A tenant whose slot is on neither the streams' primary nor the pool's: the submission
    then spans three primaries."""
    slots = {_primary(cluster, keys.KEY_PREFIX), _primary(cluster, keys.pool_prefix(model))}
    for tenant in cluster.names_on_each_node("acme", 3, keys.account_prefix):
        if _primary(cluster, keys.account_prefix(tenant)) not in slots:
            return tenant
    raise AssertionError("no tenant's slot apart from the streams' and the pool's")


def _primary(cluster: ClusterSet, prefix: str) -> int:
    from valkey.crc import key_slot

    slot = key_slot(prefix.encode())
    return next(node for first, last, node in cluster.owners() if first <= slot <= last)


def _counted(client: valkey.Valkey, slot: str, kind: str) -> int:
    """What the rate limits of ``kind`` (rpm, tpm) in ``slot`` hold, on the primary that owns
    it (the current and the previous window together: a minute may turn mid-test)."""
    node = _node_of(client, slot)
    names: Any = node.keys(slot + f"rl:*:{kind}:*")
    return sum(int(cast(bytes, node.get(name)) or 0) for name in names)


def _refund_records(client: valkey.Valkey, tenant: str) -> list[bytes]:
    node = _node_of(client, keys.account_prefix(tenant))
    return cast(list[bytes], node.keys(keys.account_prefix(tenant) + "rf:*"))


def _submit(base_url: str, key: str, body: Any) -> httpx.Response:
    return httpx.post(
        base_url + "/v1/async/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def _chat(model: str, text: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


def test_tasks_submitted_on_a_cluster_run_and_a_use_case_limit_counts_on_its_tenants_primary(
    cluster: ClusterSet, start_simulator, start_gateway, batchers, tmp_path: Path, valkey_url
) -> None:
    """GIVEN a Cluster of three primaries — the task streams' slot, the model pool's and the
    tenant's each on its own — and a use case allowed 3 requests a minute (and at most one
    at once, which async submission does not count, as on one Valkey)
    WHEN a gateway takes three async chats, one at a time and then a fourth
    THEN the three are accepted (202), the fourth refused on the use case's limit (429); the
    tenant's primary counts 3 requests and the three tasks' tokens, with no refund record left
    behind; and a batcher on the Cluster runs the three, whose results the gateway answers."""
    (model,) = cluster.names_on_each_node("chat", 1, keys.pool_prefix)
    sim = start_simulator(CHAT, "--time-scale", "0")
    policy = PolicyBuilder().model(model, [sim.base_url], served_name=CHAT)
    tenant = _tenant_apart(cluster, model)
    key = policy.key(tenant=tenant, models=[model])
    policy.use_case_limits(
        key, requests_per_minute=3, tokens_per_minute=1_000_000, max_concurrent=1
    )
    client = sync_client(cluster.url)
    policy.publish(client)
    gateway = start_gateway(valkey=cluster.url)

    accepted = [_submit(gateway.base_url, key, _chat(model, f"task {n}")) for n in range(3)]
    refused = _submit(gateway.base_url, key, _chat(model, "one too many"))

    assert [r.status_code for r in accepted] == [202] * 3, accepted[-1].text
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert "use case" in refused.json()["error"]["message"]
    assert int(refused.headers["retry-after"]) >= 1
    assert _counted(client, keys.account_prefix(tenant), "rpm") == 3
    assert _counted(client, keys.account_prefix(tenant), "tpm") > 0
    assert _refund_records(client, tenant) == []  # settled: none lingers for its TTL
    ids = [r.json()["id"] for r in accepted]
    streams_node = _node_of(client, keys.KEY_PREFIX)
    assert int(cast(bytes, streams_node.get(layout.depth(model)))) == 3

    # (Celery, for callbacks, cannot use a Cluster: the test's own Valkey is its broker)
    batchers.append(
        start_batcher_on(cluster.url, tmp_path / "batcher", SWITCHYARD_CELERY_BROKER_URL=valkey_url)
    )
    for task_id in ids:
        polled = httpx.get(
            f"{gateway.base_url}/v1/tasks/{task_id}?wait=30",
            headers={"Authorization": f"Bearer {key}"},
            timeout=40,
        )
        assert polled.status_code == 200, polled.text
        task = polled.json()
        assert task["status"] == "done", task
        assert task["result"]["choices"][0]["message"]["content"]
    assert int(cast(bytes, streams_node.get(layout.depth(model)))) == 0


def test_a_submission_the_backlog_refuses_on_a_cluster_counts_nothing(
    cluster: ClusterSet, start_simulator, start_gateway
) -> None:
    """GIVEN a gateway on a Cluster whose models may hold 2 tasks each, and a use case allowed
    10 requests a minute
    WHEN two tasks are accepted and then one more, and a bulk call of two, arrive with no
    batcher to drain them
    THEN both later calls are refused 503 async_backlog_full, and the tenant's primary still
    counts the 2 accepted requests: the refused calls' charges were given back."""
    (model,) = cluster.names_on_each_node("chat", 1, keys.pool_prefix)
    sim = start_simulator(CHAT, "--time-scale", "0")
    policy = PolicyBuilder().model(model, [sim.base_url], served_name=CHAT)
    tenant = _tenant_apart(cluster, model)
    key = policy.key(tenant=tenant, models=[model])
    policy.use_case_limits(key, requests_per_minute=10)
    client = sync_client(cluster.url)
    policy.publish(client)
    gateway = start_gateway(valkey=cluster.url, SWITCHYARD_ASYNC_MAX_BACKLOG="2")

    accepted = [_submit(gateway.base_url, key, _chat(model, f"task {n}")) for n in range(2)]
    assert [r.status_code for r in accepted] == [202, 202], accepted[-1].text
    assert _counted(client, keys.account_prefix(tenant), "rpm") == 2

    one = _submit(gateway.base_url, key, _chat(model, "no room"))
    bulk = _submit(gateway.base_url, key, [_chat(model, "a"), _chat(model, "b")])

    for refused in (one, bulk):
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "async_backlog_full"
    assert _counted(client, keys.account_prefix(tenant), "rpm") == 2
    assert _refund_records(client, tenant) == []


def test_a_global_limit_refuses_on_the_streams_slot_and_the_other_slots_are_refunded(
    cluster: ClusterSet, start_simulator, start_gateway
) -> None:
    """GIVEN a gateway on a Cluster, a global limit of 3 requests a minute (counted by
    submit.lua itself: it lives in the streams' slot) and a model and a use-case limit of 100
    (the pool's and the tenant's slots, charged first)
    WHEN four tasks are submitted
    THEN the fourth is refused on the global limit, and each of the three limits counts 3 on
    its own primary: the fourth's charges on the pool's and the tenant's slots were given
    back."""
    (model,) = cluster.names_on_each_node("chat", 1, keys.pool_prefix)
    sim = start_simulator(CHAT, "--time-scale", "0")
    policy = PolicyBuilder().model(model, [sim.base_url], served_name=CHAT)
    tenant = _tenant_apart(cluster, model)
    key = policy.key(tenant=tenant, models=[model])
    policy.use_case_limits(key, requests_per_minute=100)
    for name, scope, limit in (("everyone", "global", 3), ("one-model", "model", 100)):
        policy.rate_limits.append(
            {
                "name": name,
                "scope": scope,  # type: ignore[typeddict-item]
                "model": model if scope == "model" else None,
                "tenant": None,
                "requests_per_minute": limit,
                "tokens_per_minute": None,
                "tokens_per_day": None,
            }
        )
    client = sync_client(cluster.url)
    policy.publish(client)
    gateway = start_gateway(valkey=cluster.url)

    answers = [_submit(gateway.base_url, key, _chat(model, f"task {n}")) for n in range(4)]

    assert [r.status_code for r in answers] == [202, 202, 202, 429], answers[-1].text
    assert "global" in answers[-1].json()["error"]["message"]
    for slot in (keys.KEY_PREFIX, keys.pool_prefix(model), keys.account_prefix(tenant)):
        assert _counted(client, slot, "rpm") == 3, slot


def test_async_202s_wait_for_the_replica_of_the_streams_primary_on_a_cluster(
    tmp_path: Path, start_simulator, start_gateway
) -> None:
    """GIVEN a Cluster of three primaries with a replica each, and a gateway whose async 202s
    wait for one replica (SWITCHYARD_GATEWAY_USAGE_WAIT_REPLICAS=1)
    WHEN tasks are submitted, then the replica of the streams' primary is stopped (SIGSTOP)
    and one more is submitted
    THEN the first are answered 202 (the wait went to the primary that has the tasks, whose
    replica confirmed them), the last 503 async_not_replicated naming its task — which is
    queued on that primary all the same."""
    cluster = ClusterSet(tmp_path / "cluster", replicas=1).start()
    try:
        (model,) = cluster.names_on_each_node("chat", 1, keys.pool_prefix)
        sim = start_simulator(CHAT, "--time-scale", "0")
        policy = PolicyBuilder().model(model, [sim.base_url], served_name=CHAT)
        key = policy.key(tenant="acme", models=[model])
        policy.publish(sync_client(cluster.url))
        gateway = start_gateway(
            valkey=cluster.url,
            SWITCHYARD_GATEWAY_USAGE_WAIT_REPLICAS="1",
            SWITCHYARD_ASYNC_REPLICA_WAIT_MS="500",
        )

        accepted = [_submit(gateway.base_url, key, _chat(model, f"task {n}")) for n in range(3)]
        assert [r.status_code for r in accepted] == [202] * 3, accepted[-1].text

        streams = cluster.owner_of(keys.KEY_PREFIX)
        (replica,) = cluster.replica_of[cluster.primaries.index(streams)]
        replica.process.signal(signal.SIGSTOP)
        try:
            refused = _submit(gateway.base_url, key, _chat(model, "unconfirmed"))
        finally:
            replica.process.signal(signal.SIGCONT)

        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "async_not_replicated"
        (task_id,) = [
            word.rstrip(".,") for word in error["message"].split() if word.startswith("task_")
        ]
        status: Any = streams.client().hget(layout.task(task_id), "status")
        assert status == b"queued"
    finally:
        cluster.stop()
