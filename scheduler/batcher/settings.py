"""The batcher's settings, read once at start-up from the environment (README, "Batcher")."""

from __future__ import annotations

from dataclasses import dataclass, field

from config.env import ConfigurationError, env_float, env_int, env_str
from config.valkey_urls import for_valkey_py
from gateway.settings import (
    DEFAULT_LONG_PROMPT_TOKENS,
    GuardrailClientSettings,
    long_prompt_tokens_from_env,
)


def parse_model_batches(raw: str) -> dict[str, int]:
    """``"embed=32,chat=8"`` → {"embed": 32, "chat": 8}; a malformed pair fails loudly."""
    sizes: dict[str, int] = {}
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        model, sep, size = part.rpartition("=")
        if not sep or not model.strip():
            raise ConfigurationError(
                f"SWITCHYARD_BATCHER_MODEL_MAX_BATCH: {part!r} is not model=size"
            )
        try:
            value = int(size)
        except ValueError:
            value = 0
        if value < 1:
            raise ConfigurationError(
                f"SWITCHYARD_BATCHER_MODEL_MAX_BATCH: {part!r} needs a size of at least 1"
            )
        sizes[model.strip()] = value
    return sizes


@dataclass(frozen=True, slots=True)
class BatcherSettings:
    valkey_url: str
    max_batch: int = 64
    model_max_batch: dict[str, int] = field(default_factory=dict)
    window_ms: float = 40.0
    min_window_ms: float = 5.0
    max_window_ms: float = 45.0
    claim_idle_ms: int = 30_000
    metrics_port: int = 0
    # Loopback by default; a pod's probes and Prometheus reach it on 0.0.0.0 (deploy/k8s).
    metrics_host: str = "127.0.0.1"
    # How often the partitions registry is read again for new models.
    discover_s: float = 2.0
    # Backoff before a failed batch's tasks are tried again: base · 2^(attempt-1).
    retry_backoff_ms: int = 500
    # Tasks held at once (buffered or running): past it the batcher stops reading, leaving
    # the rest in the streams for other batchers.
    max_held: int = 4096
    policy_refresh_s: float = 1.0
    policy_max_staleness_s: float = 60.0
    upstream_connect_timeout_s: float = 2.0
    upstream_max_connections: int = 256
    lease_s: float = 30.0
    heartbeat_s: float = 5.0
    fleet_stale_s: float = 0.9
    backpressure_waiting: int = 3
    long_prompt_tokens: int = DEFAULT_LONG_PROMPT_TOKENS
    # The response stage and the record policy, as the gateway applies them (its settings of
    # the same names): the guardrail service, and what a full record's transcript keeps.
    guardrails: GuardrailClientSettings = field(default_factory=GuardrailClientSettings)
    record_max_content_bytes: int = 1024 * 1024
    record_buffer_bytes: int = 64 * 1024 * 1024

    def batch_size(self, model: str) -> int:
        return self.model_max_batch.get(model, self.max_batch)

    @classmethod
    def from_env(cls) -> BatcherSettings:
        window = env_float("SWITCHYARD_BATCHER_WINDOW_MS", 40.0, minimum=0.0)
        min_window = env_float("SWITCHYARD_BATCHER_MIN_WINDOW_MS", 5.0, minimum=0.0)
        max_window = env_float("SWITCHYARD_BATCHER_MAX_WINDOW_MS", 45.0, minimum=0.0)
        if not min_window <= window <= max_window:
            raise ConfigurationError(
                "SWITCHYARD_BATCHER_MIN_WINDOW_MS ≤ SWITCHYARD_BATCHER_WINDOW_MS ≤ "
                "SWITCHYARD_BATCHER_MAX_WINDOW_MS must hold"
            )
        return cls(
            valkey_url=for_valkey_py(env_str("SWITCHYARD_VALKEY_URL", "valkey://127.0.0.1:6390/0")),
            max_batch=env_int("SWITCHYARD_BATCHER_MAX_BATCH", 64, minimum=1),
            model_max_batch=parse_model_batches(env_str("SWITCHYARD_BATCHER_MODEL_MAX_BATCH", "")),
            window_ms=window,
            min_window_ms=min_window,
            max_window_ms=max_window,
            claim_idle_ms=env_int("SWITCHYARD_BATCHER_CLAIM_IDLE_MS", 30_000, minimum=100),
            metrics_port=env_int("SWITCHYARD_BATCHER_METRICS_PORT", 0, minimum=0),
            metrics_host=env_str("SWITCHYARD_BATCHER_METRICS_HOST", "127.0.0.1"),
            discover_s=env_float("SWITCHYARD_BATCHER_DISCOVER_SECONDS", 2.0, minimum=0.05),
            retry_backoff_ms=env_int("SWITCHYARD_BATCHER_RETRY_BACKOFF_MS", 500, minimum=0),
            max_held=env_int("SWITCHYARD_BATCHER_MAX_HELD", 4096, minimum=1),
            policy_refresh_s=env_float(
                "SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS", 1.0, minimum=0.05
            ),
            policy_max_staleness_s=env_float(
                "SWITCHYARD_GATEWAY_POLICY_MAX_STALENESS_SECONDS", 60.0, minimum=1.0
            ),
            upstream_connect_timeout_s=env_float(
                "SWITCHYARD_GATEWAY_UPSTREAM_CONNECT_TIMEOUT_SECONDS", 2.0, minimum=0.01
            ),
            lease_s=env_float("SWITCHYARD_GATEWAY_LEASE_SECONDS", 30.0, minimum=1.0),
            heartbeat_s=env_float("SWITCHYARD_GATEWAY_HEARTBEAT_SECONDS", 5.0, minimum=2.0),
            fleet_stale_s=env_float("SWITCHYARD_GATEWAY_FLEET_STALE_SECONDS", 0.9, minimum=0.05),
            backpressure_waiting=env_int("SWITCHYARD_GATEWAY_BACKPRESSURE_WAITING", 3, minimum=1),
            long_prompt_tokens=long_prompt_tokens_from_env(),
            guardrails=GuardrailClientSettings.from_env(),
            record_max_content_bytes=env_int(
                "SWITCHYARD_RECORD_MAX_CONTENT_BYTES", 1024 * 1024, minimum=1
            ),
            record_buffer_bytes=env_int(
                "SWITCHYARD_RECORD_BUFFER_BYTES", 64 * 1024 * 1024, minimum=1
            ),
        )
