"""vLLM replicas by service discovery (gateway/discovery.py), against a real DNS server on
loopback and, end to end, a real gateway, fleet watcher and simulators that follow a headless
Service's endpoints as they change."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
import valkey

from gateway.discovery import DiscoverySettings, ReplicaDiscovery, ServiceName, service_names
from gateway.policy import SNAPSHOT_KEY, parse_snapshot
from gateway.scheduling import keys
from ops.processes import (
    PYTHON,
    ManagedProcess,
    free_port,
    gateway_command,
    http_ready,
    wait_until,
)
from testkit.policy import PolicyBuilder
from tests.deploy.dns import Zone, dns_server, nameserver

SERVICE = "vllm-llama.inference.svc.cluster.local"
CHAT = "llama-test"


@pytest.fixture
def zone() -> Zone:
    return Zone()


@pytest.fixture
def dns(zone: Zone) -> Iterator[str]:
    """The zone's server address, "127.0.0.1:<port>"."""
    with dns_server(zone) as server:
        yield nameserver(server)


def discovery(ns: str, *, refresh_s: float = 3600.0) -> ReplicaDiscovery:
    return ReplicaDiscovery(DiscoverySettings(refresh_s=refresh_s, nameserver=ns, timeout_s=0.5))


def test_a_service_name_stands_for_every_pod_address_ipv4_and_ipv6(zone: Zone, dns: str) -> None:
    zone.set(SERVICE, "10.1.0.7", "10.1.0.5", "fd00::5")
    found = discovery(dns)
    name = f"dns+http://{SERVICE}:8000"

    assert asyncio.run(found.refresh([name])) is True

    assert found.replicas(name) == (
        "http://10.1.0.5:8000",
        "http://10.1.0.7:8000",
        "http://[fd00::5]:8000",
    )


def test_answers_are_kept_until_the_refresh_interval_then_followed(zone: Zone, dns: str) -> None:
    """Off the request path: a name is looked up again only once its interval has passed."""
    name = f"dns+http://{SERVICE}:8000"
    zone.set(SERVICE, "10.1.0.5")
    slow, quick = discovery(dns, refresh_s=3600), discovery(dns, refresh_s=0.05)

    async def scenario() -> None:
        assert await slow.refresh([name])
        assert await quick.refresh([name])
        zone.set(SERVICE, "10.1.0.9", "10.1.0.5")
        await asyncio.sleep(0.1)
        assert await slow.refresh([name]) is False
        assert await quick.refresh([name]) is True

    asyncio.run(scenario())

    assert slow.replicas(name) == ("http://10.1.0.5:8000",)
    assert quick.replicas(name) == ("http://10.1.0.5:8000", "http://10.1.0.9:8000")


def test_a_name_without_pods_empties_but_a_failed_lookup_keeps_the_last_answer(
    zone: Zone,
) -> None:
    name = f"dns+https://{SERVICE}"
    gone = "dns+http://vllm-gone.inference.svc.cluster.local:8000"
    zone.set(SERVICE, "10.1.0.5")
    zone.set("vllm-gone.inference.svc.cluster.local", "10.2.0.1")
    with dns_server(zone) as server:
        found = discovery(nameserver(server), refresh_s=0.05)
        asyncio.run(found.refresh([name, gone]))
        zone.remove("vllm-gone.inference.svc.cluster.local")  # NXDOMAIN: no ready pod left
        time.sleep(0.1)
        assert asyncio.run(found.refresh([name, gone])) is True
        assert found.replicas(gone) == ()
    # The DNS server is gone now: a timeout is not an empty fleet.
    time.sleep(0.1)
    assert asyncio.run(found.refresh([name, gone])) is False
    assert found.replicas(name) == ("https://10.1.0.5:443",)


def test_the_expanded_policy_lists_the_pods_and_keeps_each_deployments_served_name(
    zone: Zone, dns: str, valkey_client: valkey.Valkey
) -> None:
    zone.set(SERVICE, "10.1.0.5", "10.1.0.6")
    name = f"dns+http://{SERVICE}:8000/"
    policy = PolicyBuilder()
    policy.model(
        CHAT,
        [name, "http://10.9.0.1:8000"],
        deployments=[("llama-8b", [name]), ("llama-8b-h200", ["http://10.9.0.1:8000"])],
    )
    policy.publish(valkey_client)
    published = parse_snapshot(valkey_client.get(SNAPSHOT_KEY))  # type: ignore[arg-type]
    found = discovery(dns)
    asyncio.run(found.refresh(service_names(published)))

    model = found.expand(published).models[CHAT]

    assert model.replicas == (
        "http://10.1.0.5:8000",
        "http://10.1.0.6:8000",
        "http://10.9.0.1:8000",
    )
    assert model.served_name_for("http://10.1.0.6:8000") == "llama-8b"
    assert model.served_name_for("http://10.9.0.1:8000") == "llama-8b-h200"
    assert published.models[CHAT].replicas == (name, "http://10.9.0.1:8000")  # untouched


@pytest.mark.parametrize("bad", ["dns+ftp://vllm:8000", "dns+http://:8000", "http://vllm:8000"])
def test_only_dns_http_urls_with_a_host_are_service_names(bad: str) -> None:
    with pytest.raises(ValueError, match="service name"):
        ServiceName.parse(bad)


# --- end to end: a gateway and a fleet watcher follow the Service's endpoints -----------------
def _simulator(host: str, port: int) -> ManagedProcess:
    process = ManagedProcess(
        f"simulator-{host}",
        [PYTHON, "-m", "simulator", "--host", host, "--port", str(port),
         "--served-model-name", CHAT, "--time-scale", "0.01"],
    )  # fmt: skip
    process.start(ready=http_ready(f"http://{host}:{port}/health"), timeout=20)
    return process


def served(replica: str) -> float:
    """Requests the simulator at ``replica`` has answered (vLLM's success counter)."""
    total = 0.0
    for line in httpx.get(replica + "/metrics").text.splitlines():
        if line.startswith("vllm:request_success_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _fleet(client: valkey.Valkey) -> set[str]:
    return {url.decode() for url in client.hkeys(keys.fleet(CHAT))}


def test_the_gateway_and_watcher_follow_a_headless_services_endpoints(
    zone: Zone, dns: str, valkey_client: valkey.Valkey, valkey_url: str
) -> None:
    """GIVEN a deployment whose replicas are a headless Service's name, resolving to pod A
    WHEN the Service's endpoints move to pod B and pod A goes away
    THEN the fleet watcher scrapes B instead and the gateway's pool sends requests to B."""
    port = free_port()
    first, second = f"http://127.0.0.1:{port}", f"http://127.0.0.2:{port}"
    zone.set(SERVICE, "127.0.0.1")
    policy = PolicyBuilder()
    policy.model(CHAT, [f"dns+http://{SERVICE}:{port}"])
    key = policy.key()
    policy.publish(valkey_client)
    env = {
        "SWITCHYARD_VALKEY_URL": valkey_url,
        "SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS": "0.1",
        "SWITCHYARD_FLEET_SCRAPE_INTERVAL_SECONDS": "0.1",
        "SWITCHYARD_DISCOVERY_NAMESERVER": dns,
        "SWITCHYARD_DISCOVERY_REFRESH_SECONDS": "0.3",
    }
    pod_a = _simulator("127.0.0.1", port)
    pod_b = _simulator("127.0.0.2", port)
    watcher = ManagedProcess("fleet-watcher", [PYTHON, "-m", "gateway.fleet_watcher"], env=env)
    gateway_port = free_port()
    gateway = ManagedProcess("gateway", gateway_command("127.0.0.1", gateway_port), env=env)
    try:
        watcher.start(ready=lambda: _fleet(valkey_client) == {first}, timeout=20)
        gateway.start(
            ready=http_ready(f"http://127.0.0.1:{gateway_port}/healthz", expect=200), timeout=20
        )

        def chat(timeout: float = 10) -> httpx.Response:
            return httpx.post(
                f"http://127.0.0.1:{gateway_port}/v1/chat/completions",
                json={"model": CHAT, "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {key}"},
                timeout=timeout,
            )

        assert chat().status_code == 200
        assert (served(first), served(second)) == (1, 0)

        zone.set(SERVICE, "127.0.0.2")  # the pod moved: A is gone, B serves
        pod_a.stop()
        assert wait_until(lambda: _fleet(valkey_client) == {second}, timeout=15), _fleet(
            valkey_client
        )

        # Only B can answer now, and only a gateway whose pool lists B sends it anything. A
        # request sent before this gateway's own refresh waits for A's capacity: let it go.
        def served_by_b() -> bool:
            try:
                return chat(timeout=2).status_code == 200
            except httpx.TimeoutException:
                return False

        assert wait_until(served_by_b, timeout=30)
        assert served(second) >= 1
    finally:
        gateway.stop()
        watcher.stop()
        pod_a.stop()
        pod_b.stop()
