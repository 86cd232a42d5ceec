"""The gateway's own settings, read once at start-up. The gateway never imports Django."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.fleet_settings import FleetSettings
from guardrails.protocol import DEFAULT_MAX_TEXT_CHARS
from runtime.env import env_bool, env_float, env_int, env_list, env_str
from runtime.outbound_urls import Network, allowed_networks_from_env


@dataclass(frozen=True, slots=True)
class GuardrailClientSettings:
    """How a process reaches the guardrail service: the gateway (every door's stages) and the
    batcher (async results' response stage) read the same variables, so they cannot differ."""

    url: str = "http://127.0.0.1:8095"
    token: str = ""  # presented to the service; it refuses checks without it
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS  # refused here before sending
    timeout_s: float = 5.0
    retry_after_s: int = 5

    @classmethod
    def from_env(cls) -> GuardrailClientSettings:
        return cls(
            url=env_str("SWITCHYARD_GUARDRAIL_URL", "http://127.0.0.1:8095"),
            token=env_str("SWITCHYARD_GUARDRAIL_TOKEN", ""),
            # The service's budget (guardrails/protocol.py).
            max_text_chars=env_int(
                "SWITCHYARD_GUARDRAIL_MAX_TEXT_CHARS", DEFAULT_MAX_TEXT_CHARS, minimum=1
            ),
            # A check's whole round trip, waiting for a free worker included; past it the
            # use case's guardrail_failure applies. Above the service's own check timeout,
            # so that a stuck detector is reported by the service, not guessed at here.
            timeout_s=env_float("SWITCHYARD_GUARDRAIL_CLIENT_TIMEOUT_SECONDS", 5.0, minimum=0.01),
            retry_after_s=env_int("SWITCHYARD_GUARDRAIL_RETRY_AFTER_SECONDS", 5, minimum=1),
        )


@dataclass(frozen=True, slots=True)
class RecordCaptureSettings:
    """What a full record keeps of a transcript, and how much content may wait in memory for
    Valkey: the gateway and the batcher capture records alike, from the same variables."""

    max_content_bytes: int = 1024 * 1024  # one request's or answer's content, then truncated
    buffer_bytes: int = 64 * 1024 * 1024  # all content waiting to be written, then dropped

    @classmethod
    def from_env(cls) -> RecordCaptureSettings:
        defaults = cls()
        return cls(
            max_content_bytes=env_int(
                "SWITCHYARD_RECORD_MAX_CONTENT_BYTES", defaults.max_content_bytes, minimum=1
            ),
            buffer_bytes=env_int(
                "SWITCHYARD_RECORD_BUFFER_BYTES", defaults.buffer_bytes, minimum=1
            ),
        )


@dataclass(frozen=True, slots=True)
class ServiceAccountSettings:
    """Keycloak service-account tokens on /v1: the same variables, and so the same realm,
    audience, clients and leeway, as /api/ (config/settings.py)."""

    issuer: str
    jwks_url: str
    audience: str  # empty: not checked
    clients: frozenset[str]  # empty: any client
    leeway_s: int
    verify_ssl: bool
    timeout_s: float

    @classmethod
    def from_env(cls) -> ServiceAccountSettings | None:
        """None when no realm is configured: then a JWT is just an unknown API key."""
        issuer = env_str("SWITCHYARD_OIDC_ISSUER", "").rstrip("/")
        if not issuer:
            return None
        return cls(
            issuer=issuer,
            jwks_url=env_str(
                "SWITCHYARD_OIDC_JWKS_ENDPOINT", f"{issuer}/protocol/openid-connect/certs"
            ),
            audience=env_str("SWITCHYARD_OIDC_API_AUDIENCE", "switchyard-api"),
            clients=frozenset(env_list("SWITCHYARD_OIDC_API_CLIENTS", [])),
            leeway_s=env_int("SWITCHYARD_OIDC_API_LEEWAY_SECONDS", 30, minimum=0),
            verify_ssl=env_bool("SWITCHYARD_OIDC_VERIFY_SSL", True),
            timeout_s=float(env_int("SWITCHYARD_OIDC_TIMEOUT_SECONDS", 10, minimum=1)),
        )


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    # What every gateway, batcher and the fleet watcher must agree on (Valkey, leases,
    # staleness, backpressure, long prompts): read once, in gateway/fleet_settings.py.
    fleet: FleetSettings
    max_body_bytes: int
    max_upload_bytes: int
    upstream_max_connections: int
    service_accounts: ServiceAccountSettings | None = None
    # The guardrail service (guardrails/service.py) this gateway sends its checks to.
    guardrails: GuardrailClientSettings = GuardrailClientSettings()
    # Records (issue 12): each side of a full-record transcript is kept up to max_content_bytes
    # (the rest is cut and the record marked truncated), and the transcripts waiting in the
    # accounting buffer hold at most buffer_bytes (past it: kept as metadata only).
    records: RecordCaptureSettings = RecordCaptureSettings()
    # The web process that serves /v1/files and /v1/batches (gateway/control_proxy.py): its
    # base URL ("" answers 503), the largest body forwarded to it, and how long it may be silent.
    control_url: str = ""
    control_max_body_bytes: int = 200 * 1024 * 1024 + 1024 * 1024
    control_timeout_s: float = 300.0
    # Async tasks (docs/async.md): the most bodies one bulk submit may hold, the most tasks a
    # model may have queued or running (past it: 503 async_backlog_full), how long a queued
    # task waits to be run before it expires, how many stream partitions a model's tasks are
    # spread over (the first submit for a model registers it), the priority class their
    # upstream calls queue at (when the policy has it), and the Retry-After of a full
    # backlog while no batcher has reported a drain rate.
    async_max_bulk: int = 1000
    async_max_backlog: int = 100_000
    async_queue_ttl_s: int = 3600
    async_partitions: int = 4
    async_priority_class: str = "batch"
    async_backlog_retry_after_s: int = 30
    # Usage records leave the gateway's buffer, and an async submit answers 202, only once
    # this many Valkey replicas have them (WAIT; 0: once the primary has them). Set to 1 or
    # more with Sentinel so that a failover cannot lose a record or an acknowledged task
    # (docs/valkey-ha.md); the WAIT's own timeout, repeated.
    usage_replicas: int = 0
    usage_replica_timeout_ms: int = 100
    # How long an async submit waits for those replicas before it answers 503
    # async_not_replicated (its tasks queued on the primary only).
    async_replica_wait_ms: int = 1000
    # Networks a task's callback_url may reach although internal (runtime/outbound_urls.py):
    # SWITCHYARD_WEBHOOK_ALLOWED_NETWORKS, as the workers that send the callbacks read it.
    webhook_allowed_networks: tuple[Network, ...] = ()

    @classmethod
    def from_env(cls) -> GatewaySettings:
        return cls(
            fleet=FleetSettings.from_env(),
            max_body_bytes=env_int(
                "SWITCHYARD_GATEWAY_MAX_BODY_BYTES", 10 * 1024 * 1024, minimum=1024
            ),
            # OpenAI's own limit for audio uploads.
            max_upload_bytes=env_int(
                "SWITCHYARD_GATEWAY_MAX_UPLOAD_BYTES", 25 * 1024 * 1024, minimum=1024
            ),
            upstream_max_connections=env_int(
                "SWITCHYARD_GATEWAY_UPSTREAM_MAX_CONNECTIONS", 1000, minimum=1
            ),
            service_accounts=ServiceAccountSettings.from_env(),
            guardrails=GuardrailClientSettings.from_env(),
            records=RecordCaptureSettings.from_env(),
            control_url=env_str("SWITCHYARD_CONTROL_URL", "http://127.0.0.1:8000"),
            # A batch input of OpenAI's largest size (200 MB) and its multipart framing.
            control_max_body_bytes=env_int(
                "SWITCHYARD_CONTROL_MAX_BODY_BYTES", 201 * 1024 * 1024, minimum=1024
            ),
            control_timeout_s=env_float("SWITCHYARD_CONTROL_TIMEOUT_SECONDS", 300.0, minimum=1.0),
            async_max_bulk=env_int("SWITCHYARD_ASYNC_MAX_BULK", 1000, minimum=1),
            async_max_backlog=env_int("SWITCHYARD_ASYNC_MAX_BACKLOG", 100_000, minimum=1),
            async_queue_ttl_s=env_int("SWITCHYARD_ASYNC_QUEUE_TTL_SECONDS", 3600, minimum=1),
            async_partitions=env_int("SWITCHYARD_ASYNC_PARTITIONS", 4, minimum=1),
            async_priority_class=env_str("SWITCHYARD_ASYNC_PRIORITY_CLASS", "batch"),
            async_backlog_retry_after_s=env_int(
                "SWITCHYARD_ASYNC_BACKLOG_RETRY_AFTER_SECONDS", 30, minimum=1
            ),
            usage_replicas=env_int("SWITCHYARD_GATEWAY_USAGE_WAIT_REPLICAS", 0, minimum=0),
            usage_replica_timeout_ms=env_int(
                "SWITCHYARD_GATEWAY_USAGE_WAIT_TIMEOUT_MS", 100, minimum=1
            ),
            async_replica_wait_ms=env_int("SWITCHYARD_ASYNC_REPLICA_WAIT_MS", 1000, minimum=1),
            webhook_allowed_networks=allowed_networks_from_env(),
        )
