"""The processes under test, on loopback: Valkey, two fake vLLM replicas, a gateway, two relays.

The replicas are ``bench/gateway/instant_vllm.py`` (answers at once, at next to no CPU: the
upstream the targets are defined against) or, with ``upstream="simulator"``, the simulator
with ``--time-scale 0``. The two bare relays (bench/gateway/bare_relay.py) go to the first
replica, one with each upstream client: aiohttp, the issue's reference, and the gateway's
own.

The gateway is started as testkit/stack.py starts it (uvicorn, uvloop, httptools, no access
log, against a policy snapshot published straight to Valkey, with a fleet watcher beside it
where the gateway has one: its scheduler counts a replica without fresh metrics as
saturated), so whatever the gateway grows — admission, queueing, accounting — is measured
here. Settings are the production defaults. Every process is stopped on the way out, also
when a start fails half-way.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import valkey

from gateway.policy import (
    SCHEMA,
    SNAPSHOT_KEY,
    VERSION_KEY,
    LimitsEntry,
    ModelEntry,
    SnapshotDocument,
    snapshot_write,
)
from ops.processes import PYTHON, REPO_ROOT, ManagedProcess, free_port, http_ready
from testkit.stack import Stack as Processes
from testkit.stack import running_stack as running_processes

MODEL = "bench-chat"
UPSTREAMS = ("instant", "simulator")
RELAY_CLIENTS = ("aiohttp", "switchyard")
# Far above anything one machine can send, so that every request is admitted, but set, so
# that admission has limits to check and count: the benchmark is of the full path.
GENEROUS_LIMITS: LimitsEntry = {
    "requests_per_minute": 1_000_000_000,
    "tokens_per_minute": 1_000_000_000_000,
    "tokens_per_day": 1_000_000_000_000,
    "max_concurrent": None,
}


@dataclass(frozen=True)
class Stack:
    valkey: valkey.Valkey
    valkey_pid: int
    upstream: str  # one of UPSTREAMS
    replicas: tuple[ManagedProcess, ...]
    replica_urls: tuple[str, ...]
    gateway: ManagedProcess
    gateway_port: int
    relays: dict[str, ManagedProcess]  # by client, RELAY_CLIENTS
    relay_ports: dict[str, int]
    api_key: str
    fleet_watcher: ManagedProcess | None
    # A second gateway started from another checkout (``--baseline``): before and after a
    # change, measured in the same run, slices taking turns.
    baseline: ManagedProcess | None = None
    baseline_port: int = 0

    def valkey_info(self, section: str) -> dict[str, Any]:
        return cast(dict[str, Any], self.valkey.info(section))

    @property
    def replica_port(self) -> int:
        """The first replica's: the one the relays go to, and the "direct" path."""
        return int(self.replica_urls[0].rsplit(":", 1)[1])

    def replica_name(self, index: int) -> str:
        """Its key in ``pids``, e.g. "instant-vllm-1" or "simulator-1" (from 0)."""
        kind = "instant-vllm" if self.upstream == "instant" else "simulator"
        return f"{kind}-{index + 1}"

    @property
    def pids(self) -> dict[str, int]:
        pids = {"gateway": self.gateway.pid}
        for client, relay in self.relays.items():
            pids[relay_name(client)] = relay.pid
        pids["valkey"] = self.valkey_pid
        for index, replica in enumerate(self.replicas):
            pids[self.replica_name(index)] = replica.pid
        if self.fleet_watcher is not None:
            pids["fleet watcher"] = self.fleet_watcher.pid
        if self.baseline is not None:
            pids[BASELINE_PROCESS] = self.baseline.pid
        return pids


BASELINE_PROCESS = "gateway (baseline)"


def relay_name(client: str) -> str:
    """A relay's key in ``Stack.pids``: "relay (aiohttp)", "relay (switchyard)"."""
    return f"relay ({client})"


#: with ``routing``: the model the use case falls back to (on the same replicas)
FALLBACK_MODEL = "bench-chat-small"


def publish_policy(client: valkey.Valkey, replicas: list[str], *, routing: bool = False) -> str:
    """One model on every replica, one key allowed to use it; returns the key's plaintext.

    ``routing``: the model as governance publishes one with versions (issue 27) — v1 on the
    first replica, v2 on the others, a 95/5 split per request, an alias — and a fallback model
    in the use case's chain. Its own entry lists every replica, as governance publishes it, so
    a baseline gateway from before versions serves it too (without the split)."""
    plaintext = "sk-sy-" + secrets.token_urlsafe(32)
    use_case_id = 1
    document: SnapshotDocument = {
        "schema": SCHEMA,
        "version": 1,
        "published_at": time.time(),
        "models": {
            MODEL: {
                "served_name": MODEL,
                "capabilities": ["chat", "completions"],
                "replicas": replicas,
                "timeout_s": 30.0,
                "max_tokens": None,
                "max_in_flight_per_replica": 1024,
            }
        },
        "keys": {
            hashlib.sha256(plaintext.encode()).hexdigest(): {
                "key_id": 1,
                "prefix": plaintext[:12],
                "tenant": "bench",
                "tenant_id": 1,
                "environment": "prod",
                "use_case": "overhead",
                "use_case_id": use_case_id,
                "namespace": "prod",
                "models": [MODEL],
                "expires_at": None,
            }
        },
        "use_cases": {
            str(use_case_id): {
                "tenant": "bench",
                "slug": "overhead",
                "limits": GENEROUS_LIMITS,
                "guardrails": [],
            }
        },
    }
    if routing:
        _with_routing(document, replicas, use_case_id)
    snapshot_write(client, document)
    return plaintext


def _with_routing(document: SnapshotDocument, replicas: list[str], use_case_id: int) -> None:
    model = document["models"][MODEL]
    versions = {"v1": replicas[:1], "v2": replicas[1:] or replicas[:1]}
    model["routing"] = {
        "versions": sorted(versions),
        "split": [("v1", 95), ("v2", 5)],
        "sticky": "request",
        "aliases": {"stable": "v1"},
    }
    for label, urls in versions.items():
        version = cast(ModelEntry, {**model, "replicas": urls})
        del version["routing"]
        version["deployments"] = [{"served_name": MODEL, "replicas": urls}]
        version["version_of"] = MODEL
        version["version"] = label
        document["models"][f"{MODEL}@{label}"] = version
    document["models"][FALLBACK_MODEL] = cast(ModelEntry, {**model, "served_name": MODEL})
    del document["models"][FALLBACK_MODEL]["routing"]
    document["keys"] = {
        digest: {**key, "models": [MODEL, FALLBACK_MODEL]}
        for digest, key in document["keys"].items()
    }
    document["use_cases"][str(use_case_id)]["model_fallbacks"] = {MODEL: [FALLBACK_MODEL]}


def start_replica(
    processes: Processes, upstream: str, *, content_bytes: int = 0, timeout: float = 20.0
) -> tuple[ManagedProcess, str]:
    """A replica (one of UPSTREAMS), ready; and its base URL."""
    port = free_port()
    if upstream == "instant":
        process = processes.start(
            f"instant-vllm-{port}",
            [
                PYTHON, "-m", "bench.gateway.instant_vllm", "--host", "127.0.0.1",
                "--port", str(port), "--served-model-name", MODEL,
                "--content-bytes", str(content_bytes),
            ],
            ready=http_ready(f"http://127.0.0.1:{port}/health"),
            timeout=timeout,
        )  # fmt: skip
        return process, f"http://127.0.0.1:{port}"
    simulator = processes.simulator(
        MODEL, "--time-scale", "0", "--max-num-seqs", "1024",
        name=f"simulator-{port}", port=port, timeout=timeout,
    )  # fmt: skip
    return simulator.process, simulator.base_url


@contextlib.contextmanager
def running_stack(
    replicas: int = 2,
    upstream: str = "instant",
    baseline_src: Path | None = None,
    *,
    content_bytes: int = 0,
    routing: bool = False,
) -> Iterator[Stack]:
    """``baseline_src``: another checkout of the project (``git worktree``) whose gateway is
    started beside this one's, on the same Valkey, replicas and policy. ``content_bytes``:
    the instant replicas' answer text size (0: four short words). ``routing``: the model with
    versions, a split and a fallback (``publish_policy``)."""
    if upstream not in UPSTREAMS:
        raise ValueError(f"upstream is one of {UPSTREAMS}, not {upstream!r}")
    if content_bytes and upstream != "instant":
        raise ValueError("content_bytes sizes the instant replicas' answers only")
    with contextlib.ExitStack() as stack:
        # Removed last, once every process is stopped; a failed start shows its log's tail.
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="switchyard-bench-")))
        processes = stack.enter_context(running_processes(logs))
        store = processes.valkey()
        client = store.client
        started = [
            start_replica(processes, upstream, content_bytes=content_bytes) for _ in range(replicas)
        ]
        urls = [url for _, url in started]
        api_key = publish_policy(client, urls, routing=routing)
        if baseline_src is not None:
            # A baseline from before the snapshot's keys took their hash tag (issue 16)
            # reads them under their old names: the same document there too.
            for old, new in (
                ("switchyard:policy:snapshot", SNAPSHOT_KEY),
                ("switchyard:policy:version", VERSION_KEY),
            ):
                client.set(old, cast(bytes, client.get(new)))
        env = {"SWITCHYARD_VALKEY_URL": store.url}

        watcher = None
        if (REPO_ROOT / "gateway" / "fleet_watcher.py").exists():
            watcher = processes.fleet_watcher(env, ready=_fleet_written(client, urls))

        gateway = processes.gateway(env, name="gateway")

        baseline, baseline_port = None, 0
        if baseline_src is not None:
            # Its own packages first: the editable install's finder comes after sys.path.
            baseline_env = {**env, "PYTHONPATH": str(baseline_src)}
            # Its own fleet watcher too: a baseline from before admission's keys moved to
            # their pools' slots (issue 16) reads the fleet where its watcher writes it.
            processes.fleet_watcher(
                baseline_env, ready=None, name="fleet-watcher-baseline", cwd=baseline_src
            )
            time.sleep(1.0)  # a few of its cycles, before the baseline's first request
            started_baseline = processes.gateway(
                baseline_env, name="gateway-baseline", cwd=baseline_src
            )
            baseline, baseline_port = started_baseline.process, started_baseline.port

        relays: dict[str, ManagedProcess] = {}
        relay_ports: dict[str, int] = {}
        for relay_client in RELAY_CLIENTS:
            relay_port = free_port()
            relays[relay_client] = processes.start(
                f"bare-relay-{relay_client}",
                [
                    PYTHON, "-m", "bench.gateway.bare_relay", "--port", str(relay_port),
                    "--upstream", urls[0], "--client", relay_client,
                ],
                ready=http_ready(f"http://127.0.0.1:{relay_port}/health", expect=200),
            )  # fmt: skip
            relay_ports[relay_client] = relay_port

        yield Stack(
            valkey=client,
            valkey_pid=store.pid,
            upstream=upstream,
            replicas=tuple(replica for replica, _ in started),
            replica_urls=tuple(urls),
            gateway=gateway.process,
            gateway_port=gateway.port,
            relays=relays,
            relay_ports=relay_ports,
            api_key=api_key,
            fleet_watcher=watcher,
            baseline=baseline,
            baseline_port=baseline_port,
        )


def _fleet_written(client: valkey.Valkey, replicas: list[str]) -> Callable[[], bool]:
    """The watcher has scraped every replica of the model once."""
    from gateway.scheduling import keys  # only where the gateway has a scheduler

    def probe() -> bool:
        return all(bool(client.hexists(keys.fleet(MODEL), replica)) for replica in replicas)

    return probe
