"""Limits across gateways on several hosts (network namespaces, testkit/netns.py): a
Valkey Cluster of three primaries on three hosts, three gateways on three more (one with its
wall clock 45 s ahead), two simulators on two more. Sixty requests sent at once, spread over
the three gateways and two model pools on different primaries, against a use case allowed 30
a minute: exactly 30 are answered and 30 refused on the use case's limit — the split slots'
bound (docs/gateway-scheduling.md "Scale-out": never over a limit) across gateways and hosts —
and the use case's count, on its tenant's primary, is 30."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import valkey
from valkey.crc import key_slot

from gateway.scheduling import keys
from ops.processes import PYTHON, gateway_command, http_ready, wait_until
from runtime.valkey_urls import sync_client
from testkit.netns import Host, skewed
from testkit.policy import PolicyBuilder
from testkit.valkey_ha import VALKEY_SERVER, names_on_nodes
from tests.scaleout.conftest import NetworkFactory

CHAT = "llama-hosts"
PORT, BUS = 7000, 17000
LIMIT = 30  # requests a minute for the use case
SENT = 60


def start_cluster(primaries: list[Host], tmp_path: Path) -> list[valkey.Valkey]:
    """One primary on each host (its own address, announced so), slots split in three,
    met over the bridge. Returns a client per primary."""
    for host in primaries:
        folder = tmp_path / host.name
        folder.mkdir()
        host.process(
            "valkey",
            [VALKEY_SERVER, "--bind", host.address, "--port", str(PORT), "--save", "",
             "--appendonly", "no", "--protected-mode", "no", "--dir", str(folder),
             "--cluster-enabled", "yes", "--cluster-config-file", str(folder / "nodes.conf"),
             "--cluster-node-timeout", "2000", "--cluster-port", str(BUS),
             "--cluster-announce-ip", host.address],
            log_dir=tmp_path,
        ).start(ready=partial(_pings, host.address), timeout=10)  # fmt: skip
    clients = [valkey.Valkey(host=h.address, port=PORT) for h in primaries]
    share = 16384 // len(clients)
    for index, client in enumerate(clients):
        last = 16383 if index == len(clients) - 1 else (index + 1) * share - 1
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", index * share, last)
    for host in primaries[1:]:
        clients[0].execute_command("CLUSTER", "MEET", host.address, PORT, BUS)

    def converged() -> bool:
        return all(
            b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO")
            and f"cluster_known_nodes:{len(clients)}".encode()
            in c.execute_command("CLUSTER", "INFO")
            for c in clients
        )

    assert wait_until(converged, timeout=20), "the cluster did not converge"
    return clients


def _pings(host: str) -> bool:
    try:
        return bool(valkey.Valkey(host=host, port=PORT, socket_timeout=0.5).ping())
    except (valkey.ValkeyError, OSError):
        return False


def _owners(client: valkey.Valkey, primaries: list[Host]) -> list[tuple[int, int, int]]:
    addresses = [h.address for h in primaries]
    slots: Any = client.execute_command("CLUSTER", "SLOTS")
    return [
        (int(first), int(last), addresses.index(primary[0].decode()))
        for first, last, primary, *_ in slots
    ]


def test_a_use_case_limit_holds_across_three_gateways_on_three_hosts_over_a_cluster(
    hosts: NetworkFactory, tmp_path: Path
) -> None:
    names = ["v1", "v2", "v3", "g1", "g2", "g3", "s1", "s2"]
    network = hosts(names)
    primaries = [network[n] for n in ("v1", "v2", "v3")]
    nodes = start_cluster(primaries, tmp_path)
    url = "valkey+cluster://" + ",".join(f"{h.address}:{PORT}" for h in primaries)

    sims = []
    for name in ("s1", "s2"):
        host = network[name]
        sim_url = f"http://{host.address}:8000"
        host.process(
            "simulator",
            [PYTHON, "-m", "simulator", "--host", host.address, "--port", "8000",
             "--served-model-name", CHAT, "--time-scale", "0"],
            log_dir=tmp_path,
        ).start(ready=http_ready(sim_url + "/health"), timeout=20)  # fmt: skip
        sims.append(sim_url)

    owners = _owners(nodes[0], primaries)
    models = names_on_nodes("chat", 2, keys.pool_prefix, owners)
    policy = PolicyBuilder()
    for model in models:
        policy.model(model, sims, served_name=CHAT)
    key = policy.key(tenant="acme", models=models)
    policy.use_case_limits(key, requests_per_minute=LIMIT)
    setup = sync_client(url)
    policy.publish(setup)

    env = {"SWITCHYARD_VALKEY_URL": url, "SWITCHYARD_FLEET_SCRAPE_INTERVAL_SECONDS": "0.1"}
    network["g1"].process(
        "fleet-watcher", [PYTHON, "-m", "gateway.fleet_watcher"], env=env, log_dir=tmp_path
    ).start(ready=lambda: all(setup.hlen(keys.fleet(m)) for m in models), timeout=30)
    gateways = []
    for name, skew in (("g1", 0), ("g2", 0), ("g3", 45)):
        host = network[name]
        command = gateway_command(host.address, 8080)
        process = host.process(
            "gateway", skewed(command, offset_s=skew) if skew else command, env=env,
            log_dir=tmp_path,
        )  # fmt: skip
        base = f"http://{host.address}:8080"
        process.start(ready=http_ready(base + "/healthz", expect=200), timeout=30)
        gateways.append(base)

    # Stay inside one minute's window: the burst must not straddle two.
    if 60 - time.time() % 60 < 20:
        time.sleep(60 - time.time() % 60 + 0.5)

    def chat(n: int) -> int:
        response = httpx.post(
            gateways[n % 3] + "/v1/chat/completions",
            json={"model": models[n % 2], "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        if response.status_code == 429:
            assert "use case" in response.json()["error"]["message"], response.text
        return response.status_code

    with ThreadPoolExecutor(max_workers=SENT) as pool:
        statuses = list(pool.map(chat, range(SENT)))

    assert sorted(statuses) == [200] * LIMIT + [429] * (SENT - LIMIT), statuses
    tenant = nodes[
        next(
            node
            for first, last, node in owners
            if first <= key_slot(keys.account_prefix("acme").encode()) <= last
        )
    ]
    counted: Any = tenant.keys(keys.account_prefix("acme") + "rl:*:rpm:*")
    values: list[Any] = [tenant.get(name) for name in counted]
    assert [int(v or 0) for v in values] == [LIMIT]
