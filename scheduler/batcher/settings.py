"""The batcher's settings, read once at start-up from the environment (docs/configuration.md,
"Batcher")."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.fleet_settings import FleetSettings
from gateway.settings import GuardrailClientSettings, RecordCaptureSettings
from runtime.env import ConfigurationError, env_float, env_int, env_str


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
    # What the gateways and the fleet watcher must agree with (gateway/fleet_settings.py):
    # the batcher acquires the same leases against the same pool records.
    fleet: FleetSettings
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
    upstream_max_connections: int = 256
    # The response stage and the record policy, as the gateway applies them (its settings of
    # the same names): the guardrail service, and what a full record's transcript keeps.
    guardrails: GuardrailClientSettings = field(default_factory=GuardrailClientSettings)
    records: RecordCaptureSettings = field(default_factory=RecordCaptureSettings)

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
            fleet=FleetSettings.from_env(),
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
            guardrails=GuardrailClientSettings.from_env(),
            records=RecordCaptureSettings.from_env(),
        )
