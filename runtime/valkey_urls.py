"""One Valkey URL in, the client (or the spelling) each library needs out.

Operators configure a single ``SWITCHYARD_VALKEY_URL``; every Valkey client in the project is
made here (``sync_client`` / ``async_client``), so a deployment moves from one server to
Sentinel or Cluster by changing that URL alone. Accepted spellings (docs/valkey-ha.md):

- ``valkey://[user:password@]host:port/db`` (``redis://`` too), ``valkeys://`` (TLS),
  ``unix:///path/to/socket?db=0``: one server.
- ``valkey+sentinel://[user:password@]host1:26379,host2:26379/<service_name>/<db>``: the
  sentinels are asked for the primary of ``service_name`` at every (re)connect, so a client
  follows a failover. ``?sentinel_password=…`` when the sentinels have their own password.
- ``valkey+cluster://[user:password@]host1:7000,host2:7001``: a Cluster (database 0 only);
  the nodes listed are where discovery starts.

Celery/kombu only know the Redis spellings (``redis://``, ``redis+socket://``,
``sentinel://`` with ``master_name`` in the transport options) and have no Cluster
transport; channels-valkey has Sentinel and no Cluster. Those parts take their own
non-cluster URL (``SWITCHYARD_CELERY_BROKER_URL``, ``SWITCHYARD_CHANNELS_VALKEY_URL``) and
refuse a cluster URL at start with a ``ConfigurationError`` that says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal, cast
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

import valkey
import valkey.asyncio as avalkey
import valkey.asyncio.cluster as acluster
import valkey.asyncio.sentinel as asentinel
import valkey.cluster
import valkey.sentinel
from valkey.exceptions import ValkeyClusterException

from runtime.env import ConfigurationError

# Where every process looks when SWITCHYARD_VALKEY_URL is unset: the embedded stack's Valkey
# (`make up`, ops/stack.py). The one copy of this default.
DEFAULT_VALKEY_URL = "valkey://127.0.0.1:6390/0"

# What a call to Valkey raises when Valkey (or the way to it) fails, on any topology: the
# client's errors, the socket's, and valkey-py's ValkeyClusterException (no node reachable
# while a Cluster client re-reads its slot map), which is not a ValkeyError. Catch this, not
# a tuple of one's own, so that a Cluster's failover is handled where a server's would be.
VALKEY_FAILURES: tuple[type[BaseException], ...] = (
    valkey.ValkeyError,
    OSError,
    ValkeyClusterException,
)

_TO_REDIS = {"valkey": "redis", "valkeys": "rediss", "redis": "redis", "rediss": "rediss"}
_SINGLE = {"valkey", "valkeys", "redis", "rediss", "unix"}
_SENTINEL = {"valkey+sentinel", "redis+sentinel"}
_CLUSTER = {"valkey+cluster", "redis+cluster"}

Mode = Literal["single", "sentinel", "cluster"]


@dataclass(frozen=True)
class ValkeyTarget:
    """A parsed URL: which topology, where, and as whom."""

    mode: Mode
    url: str  # the single-server URL (valkey-py's spelling); "" for the others
    nodes: tuple[tuple[str, int], ...] = ()
    service_name: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    options: dict[str, str] = field(default_factory=dict)


def _nodes(netloc: str, setting: str, default_port: int) -> tuple[tuple[str, int], ...]:
    hostports = netloc.rpartition("@")[2]
    nodes = []
    for hostport in filter(None, hostports.split(",")):
        host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "")
        try:
            nodes.append((host.strip("[]"), int(port) if port else default_port))
        except ValueError as exc:
            raise ConfigurationError(f"{setting}: {hostport!r} is not host:port") from exc
    if not nodes:
        raise ConfigurationError(f"{setting}: name at least one host:port")
    return tuple(nodes)


def parse_valkey_url(url: str, setting: str = "SWITCHYARD_VALKEY_URL") -> ValkeyTarget:
    """Raises ``ConfigurationError`` (a ``ValueError``) naming ``setting`` on a bad URL."""
    parts = urlsplit(url)
    scheme = parts.scheme
    if scheme in _SINGLE:
        return ValkeyTarget("single", url)
    userinfo = parts.netloc.rpartition("@")[0]
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    common: dict[str, Any] = {
        "username": unquote(username) or None,
        "password": unquote(password) or None,
        "options": options,
    }
    if scheme in _SENTINEL:
        path = [p for p in parts.path.split("/") if p]
        if not path:
            raise ConfigurationError(
                f"{setting}: a Sentinel URL names its service: "
                "valkey+sentinel://host1:26379,host2:26379/<service_name>/<db>"
            )
        try:
            db = int(path[1]) if len(path) > 1 else 0
        except ValueError as exc:
            raise ConfigurationError(f"{setting}: database {path[1]!r} is not a number") from exc
        nodes = _nodes(parts.netloc, setting, 26379)
        return ValkeyTarget("sentinel", "", nodes, path[0], db, **common)
    if scheme in _CLUSTER:
        if parts.path.strip("/") not in ("", "0"):
            raise ConfigurationError(f"{setting}: a Valkey Cluster has database 0 only")
        return ValkeyTarget("cluster", "", _nodes(parts.netloc, setting, 6379), **common)
    raise ConfigurationError(
        f"{setting} has scheme {scheme!r}; use valkey://, valkeys://, unix://, "
        "valkey+sentinel:// or valkey+cluster://"
    )


def validate_valkey_url(url: str) -> str:
    parse_valkey_url(url)
    return url


def for_valkey_py(url: str) -> str:
    """The URL as this module's clients take it: redis spellings become valkey ones."""
    target = parse_valkey_url(url)
    parts = urlsplit(url)
    if target.mode != "single":
        return urlunsplit((parts.scheme.replace("redis+", "valkey+"), *parts[1:]))
    if parts.scheme == "unix":
        return url
    scheme = {"redis": "valkey", "rediss": "valkeys"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, *parts[1:]))


# --- valkey-py clients --------------------------------------------------------------------


def _sentinel_kwargs(target: ValkeyTarget, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The sentinels' own connection options: the timeouts asked for, their password."""
    own = {k: v for k, v in kwargs.items() if k in ("socket_timeout", "socket_connect_timeout")}
    # A sentinel that does not answer (partitioned) must not hang discovery: the next one
    # is asked instead.
    own.setdefault("socket_timeout", 1.0)
    own.setdefault("socket_connect_timeout", 1.0)
    if "sentinel_password" in target.options:
        own["password"] = target.options["sentinel_password"]
    return own


def sync_client(url: str, **kwargs: Any) -> valkey.Valkey:
    """A blocking client for ``url``, whatever its topology; ``kwargs`` as ``Valkey()``'s.

    A Cluster's client is a ``ValkeyCluster``, typed here as ``Valkey``: the single-key
    commands and pipelines the project uses behave the same (see docs/valkey-ha.md)."""
    target = parse_valkey_url(url)
    if target.mode == "single":
        return valkey.Valkey.from_url(for_valkey_py(url), **kwargs)
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.mode == "sentinel":
        sentinel = valkey.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.nodes), sentinel_kwargs=_sentinel_kwargs(target, kwargs)
        )
        primary = sentinel.master_for(  # type: ignore[no-untyped-call]
            target.service_name, db=target.db, **auth, **kwargs
        )
        return cast(valkey.Valkey, primary)
    nodes = [valkey.cluster.ClusterNode(h, p) for h, p in target.nodes]  # type: ignore[no-untyped-call]
    return cast(valkey.Valkey, valkey.cluster.ValkeyCluster(startup_nodes=nodes, **auth, **kwargs))


def async_client(url: str, **kwargs: Any) -> avalkey.Valkey:
    """``sync_client`` for asyncio (valkey.asyncio)."""
    target = parse_valkey_url(url)
    if target.mode == "single":
        return cast(avalkey.Valkey, avalkey.Valkey.from_url(for_valkey_py(url), **kwargs))
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.mode == "sentinel":
        sentinel = asentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.nodes), sentinel_kwargs=_sentinel_kwargs(target, kwargs)
        )
        primary = sentinel.master_for(target.service_name, db=target.db, **auth, **kwargs)
        return cast(avalkey.Valkey, primary)
    nodes = [acluster.ClusterNode(host, port) for host, port in target.nodes]
    client = _AsyncCluster(startup_nodes=nodes, **auth, **kwargs)
    client.pubsub_nodes = (list(target.nodes), auth)
    return cast(avalkey.Valkey, client)


class _AsyncCluster(acluster.ValkeyCluster):
    """valkey.asyncio's Cluster client has no ``pubsub()``; a Cluster delivers a PUBLISH to
    every node's subscribers, so subscribing on one node is enough: the first one listed
    that accepts the connection, the next one when it dies (the scheduler's grants also
    arrive by polling meanwhile)."""

    pubsub_nodes: tuple[list[tuple[str, int]], dict[str, Any]]

    def pubsub(self, **kwargs: Any) -> avalkey.client.PubSub:
        nodes, auth = self.pubsub_nodes
        pool = avalkey.ConnectionPool(connection_class=_AnyNodeConnection, nodes=nodes, **auth)
        return avalkey.Valkey(connection_pool=pool).pubsub(**kwargs)


class _AnyNodeConnection(avalkey.Connection):
    """A connection to the first of ``nodes`` that accepts one, starting from the last that
    did: a pub/sub reconnecting after its node died moves to the next node (valkey-py's
    PubSub re-subscribes on reconnect) instead of knocking at the dead one."""

    def __init__(self, *, nodes: list[tuple[str, int]], **kwargs: Any) -> None:
        self._nodes = list(nodes)
        host, port = self._nodes[0]
        super().__init__(host=host, port=port, **kwargs)

    async def _connect(self) -> None:
        for attempt in range(len(self._nodes)):
            try:
                await super()._connect()  # type: ignore[no-untyped-call]
                return
            except (OSError, TimeoutError):
                if attempt == len(self._nodes) - 1:
                    raise
                self._nodes.append(self._nodes.pop(0))
                self.host, self.port = self._nodes[0]


def transaction(client: valkey.Valkey, key: str) -> valkey.client.Pipeline:
    """A MULTI/EXEC pipeline for commands on ``key``'s slot, whatever the topology.

    valkey-py refuses MULTI on a Cluster client, although Valkey runs one whose keys share
    a slot: on a Cluster it is opened on the primary that owns ``key``'s slot."""
    if isinstance(client, valkey.cluster.ValkeyCluster):
        node = client.get_node_from_key(key)
        return cast(valkey.Valkey, node.valkey_connection).pipeline(transaction=True)
    return client.pipeline(transaction=True)


async def async_transaction(client: avalkey.Valkey, key: str) -> avalkey.client.Pipeline:
    """``transaction`` for asyncio clients."""
    if not isinstance(client, acluster.ValkeyCluster):
        return client.pipeline(transaction=True)
    await client.initialize()
    node = client.get_node_from_key(key)
    nodes: dict[str, avalkey.Valkey] = client.__dict__.setdefault("_switchyard_nodes", {})
    if node.name not in nodes:
        own = {k: v for k, v in node.connection_kwargs.items() if k in _NODE_KWARGS}
        nodes[node.name] = avalkey.Valkey(host=node.host, port=node.port, **own)
    return nodes[node.name].pipeline(transaction=True)


_NODE_KWARGS = ("username", "password", "socket_timeout", "socket_connect_timeout", "db")


def is_cluster(url: str) -> bool:
    return parse_valkey_url(url).mode == "cluster"


# --- Celery / kombu -----------------------------------------------------------------------


def for_kombu(url: str, setting: str = "SWITCHYARD_VALKEY_URL") -> str:
    """The broker / result-backend URL for Celery (kombu's Redis transport).

    A Sentinel URL becomes kombu's ``sentinel://h1:p1/db;sentinel://h2:p2/db`` (the service
    name goes in the transport options: ``kombu_transport_options``)."""
    target = parse_valkey_url(url, setting)
    if target.mode == "cluster":
        raise ConfigurationError(
            f"{setting} is a Valkey Cluster, which Celery (kombu) cannot use as its broker or "
            "result backend: set SWITCHYARD_CELERY_BROKER_URL to a single server or a "
            "Sentinel URL (valkey:// or valkey+sentinel://)"
        )
    if target.mode == "sentinel":
        userinfo = urlsplit(url).netloc.rpartition("@")[0]
        auth = f"{userinfo}@" if userinfo else ""
        return ";".join(f"sentinel://{auth}{h}:{p}/{target.db}" for h, p in target.nodes)
    parts = urlsplit(url)
    if parts.scheme == "unix":
        # Spelled by hand: urlunsplit drops the "//" when there is no host.
        return f"redis+socket://{parts.path}" + (f"?{parts.query}" if parts.query else "")
    return urlunsplit((_TO_REDIS[parts.scheme], *parts[1:]))


def kombu_transport_options(url: str) -> dict[str, Any]:
    """What kombu needs beside ``for_kombu``'s URL: for Sentinel, the service name."""
    target = parse_valkey_url(url)
    if target.mode != "sentinel":
        return {}
    options: dict[str, Any] = {"master_name": target.service_name}
    if "sentinel_password" in target.options:
        options["sentinel_kwargs"] = {"password": target.options["sentinel_password"]}
    return options


def celery_broker(valkey_url: str) -> tuple[str, dict[str, Any]]:
    """Celery's broker URL and transport options for a process that knows only the Valkey
    URL (the batcher): ``SWITCHYARD_CELERY_BROKER_URL`` when set, else ``valkey_url``."""
    own = os.environ.get("SWITCHYARD_CELERY_BROKER_URL", "")
    url = own or valkey_url
    setting = "SWITCHYARD_CELERY_BROKER_URL" if own else "SWITCHYARD_VALKEY_URL"
    return for_kombu(url, setting), kombu_transport_options(url)


# --- Django Channels (channels-valkey) ----------------------------------------------------


def for_channels(url: str, setting: str = "SWITCHYARD_VALKEY_URL") -> list[Any]:
    """``CHANNEL_LAYERS[...]["CONFIG"]["hosts"]`` for channels-valkey."""
    target = parse_valkey_url(url, setting)
    if target.mode == "cluster":
        raise ConfigurationError(
            f"{setting} is a Valkey Cluster, which the Channels layer (channels-valkey) "
            "cannot use: set SWITCHYARD_CHANNELS_VALKEY_URL to a single server or a "
            "Sentinel URL (valkey:// or valkey+sentinel://)"
        )
    if target.mode == "single":
        return [for_valkey_py(url)]
    host: dict[str, Any] = {
        "sentinels": list(target.nodes),
        "master_name": target.service_name,
        "db": target.db,
    }
    if target.username:
        host["username"] = target.username
    if target.password:
        host["password"] = target.password
    if "sentinel_password" in target.options:
        host["sentinel_kwargs"] = {"password": target.options["sentinel_password"]}
    return [host]
