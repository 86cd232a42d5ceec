"""What the gateways, the batchers and the fleet watcher must agree on, read in one place.

They admit against the same Valkey leases and pool records and load the same policy snapshot:
a gateway and a batcher that judged a replica's staleness, a lease's life or a long prompt
differently would hand out the same capacity twice. Each process's settings embed this one
object instead of reading the variables themselves, so they cannot disagree on a value, a
default or a bound. The variable names are the gateway's (docs/configuration.md, "Gateway").
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.env import env_float, env_int, env_str
from runtime.valkey_urls import DEFAULT_VALKEY_URL, for_valkey_py

# A prompt longer than one chunk of vLLM's default prefill budget (max_num_batched_tokens,
# 8192) stalls its batch-mates for several steps: it runs apart where the pool has lanes.
DEFAULT_LONG_PROMPT_TOKENS = 8192


@dataclass(frozen=True, slots=True)
class FleetSettings:
    valkey_url: str  # valkey-py's spelling (runtime/valkey_urls.py)
    policy_refresh_s: float = 1.0
    policy_max_staleness_s: float = 60.0
    upstream_connect_timeout_s: float = 2.0
    # A crashed gateway's capacity comes back within this; running requests renew.
    lease_s: float = 30.0
    # A gateway silent this long counts as dead: its queued requests are dropped and its
    # leases released at once (kill -9 gives capacity back within it).
    heartbeat_s: float = 5.0
    # Fleet metrics older than this count a replica as saturated, never idle.
    fleet_stale_s: float = 0.9
    # Waiting requests on a replica past which it takes no more (backpressure).
    backpressure_waiting: int = 3
    # Prompts of at least this many tokens run apart from short requests in pools of three
    # replicas or more (docs/gateway-scheduling.md, "Long prompts"); 0 turns lanes off. The
    # pool records it: every process that acquires must agree.
    long_prompt_tokens: int = DEFAULT_LONG_PROMPT_TOKENS

    @property
    def lease_ms(self) -> int:
        return int(self.lease_s * 1000)

    @property
    def heartbeat_ms(self) -> int:
        return int(self.heartbeat_s * 1000)

    @property
    def stale_ms(self) -> int:
        return int(self.fleet_stale_s * 1000)

    @classmethod
    def from_env(cls) -> FleetSettings:
        """The defaults are the fields' own: one default per value."""
        default = cls(valkey_url=DEFAULT_VALKEY_URL)
        return cls(
            valkey_url=for_valkey_py(env_str("SWITCHYARD_VALKEY_URL", default.valkey_url)),
            policy_refresh_s=env_float(
                "SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS", default.policy_refresh_s, minimum=0.05
            ),
            policy_max_staleness_s=env_float(
                "SWITCHYARD_GATEWAY_POLICY_MAX_STALENESS_SECONDS",
                default.policy_max_staleness_s,
                minimum=1.0,
            ),
            upstream_connect_timeout_s=env_float(
                "SWITCHYARD_GATEWAY_UPSTREAM_CONNECT_TIMEOUT_SECONDS",
                default.upstream_connect_timeout_s,
                minimum=0.01,
            ),
            lease_s=env_float("SWITCHYARD_GATEWAY_LEASE_SECONDS", default.lease_s, minimum=1.0),
            heartbeat_s=env_float(
                "SWITCHYARD_GATEWAY_HEARTBEAT_SECONDS", default.heartbeat_s, minimum=2.0
            ),
            fleet_stale_s=env_float(
                "SWITCHYARD_GATEWAY_FLEET_STALE_SECONDS", default.fleet_stale_s, minimum=0.05
            ),
            backpressure_waiting=env_int(
                "SWITCHYARD_GATEWAY_BACKPRESSURE_WAITING", default.backpressure_waiting, minimum=1
            ),
            long_prompt_tokens=env_int(
                "SWITCHYARD_GATEWAY_LONG_PROMPT_TOKENS", default.long_prompt_tokens, minimum=0
            ),
        )
