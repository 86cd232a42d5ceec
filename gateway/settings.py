"""The gateway's own settings, read once at start-up. The gateway never imports Django."""

from __future__ import annotations

from dataclasses import dataclass

from config.env import env_bool, env_float, env_int, env_list, env_str
from config.outbound_urls import Network, allowed_networks_from_env
from config.valkey_urls import for_valkey_py
from guardrails.protocol import DEFAULT_MAX_TEXT_CHARS

# A prompt longer than one chunk of vLLM's default prefill budget (max_num_batched_tokens,
# 8192) stalls its batch-mates for several steps: it runs apart where the pool has lanes.
DEFAULT_LONG_PROMPT_TOKENS = 8192


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
    valkey_url: str
    policy_refresh_s: float
    policy_max_staleness_s: float
    max_body_bytes: int
    max_upload_bytes: int
    upstream_connect_timeout_s: float
    upstream_max_connections: int
    lease_s: float
    heartbeat_s: float
    fleet_stale_s: float
    backpressure_waiting: int
    long_prompt_tokens: int
    service_accounts: ServiceAccountSettings | None = None
    # The guardrail service (guardrails/service.py) this gateway sends its checks to.
    guardrails: GuardrailClientSettings = GuardrailClientSettings()
    # Records (issue 12): each side of a full-record transcript is kept up to this many bytes
    # (the rest is cut and the record marked truncated), and the transcripts waiting in the
    # accounting buffer hold at most this many bytes (past it: kept as metadata only).
    record_max_content_bytes: int = 1024 * 1024
    record_buffer_bytes: int = 64 * 1024 * 1024
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
    # Networks a task's callback_url may reach although internal (config/outbound_urls.py):
    # SWITCHYARD_WEBHOOK_ALLOWED_NETWORKS, as the workers that send the callbacks read it.
    webhook_allowed_networks: tuple[Network, ...] = ()

    @classmethod
    def from_env(cls) -> GatewaySettings:
        return cls(
            valkey_url=for_valkey_py(env_str("SWITCHYARD_VALKEY_URL", "valkey://127.0.0.1:6390/0")),
            policy_refresh_s=env_float(
                "SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS", 1.0, minimum=0.05
            ),
            policy_max_staleness_s=env_float(
                "SWITCHYARD_GATEWAY_POLICY_MAX_STALENESS_SECONDS", 60.0, minimum=1.0
            ),
            max_body_bytes=env_int(
                "SWITCHYARD_GATEWAY_MAX_BODY_BYTES", 10 * 1024 * 1024, minimum=1024
            ),
            # OpenAI's own limit for audio uploads.
            max_upload_bytes=env_int(
                "SWITCHYARD_GATEWAY_MAX_UPLOAD_BYTES", 25 * 1024 * 1024, minimum=1024
            ),
            upstream_connect_timeout_s=env_float(
                "SWITCHYARD_GATEWAY_UPSTREAM_CONNECT_TIMEOUT_SECONDS", 2.0, minimum=0.01
            ),
            upstream_max_connections=env_int(
                "SWITCHYARD_GATEWAY_UPSTREAM_MAX_CONNECTIONS", 1000, minimum=1
            ),
            # A crashed gateway's capacity comes back within this; running requests renew.
            lease_s=env_float("SWITCHYARD_GATEWAY_LEASE_SECONDS", 30.0, minimum=1.0),
            # A gateway silent this long counts as dead: its queued requests are dropped and
            # its leases released at once (kill -9 gives capacity back within it).
            heartbeat_s=env_float("SWITCHYARD_GATEWAY_HEARTBEAT_SECONDS", 5.0, minimum=2.0),
            # Fleet metrics older than this count a replica as saturated, never idle.
            fleet_stale_s=env_float("SWITCHYARD_GATEWAY_FLEET_STALE_SECONDS", 0.9, minimum=0.05),
            backpressure_waiting=env_int("SWITCHYARD_GATEWAY_BACKPRESSURE_WAITING", 3, minimum=1),
            long_prompt_tokens=long_prompt_tokens_from_env(),
            service_accounts=ServiceAccountSettings.from_env(),
            guardrails=GuardrailClientSettings.from_env(),
            record_max_content_bytes=env_int(
                "SWITCHYARD_RECORD_MAX_CONTENT_BYTES", 1024 * 1024, minimum=1
            ),
            record_buffer_bytes=env_int(
                "SWITCHYARD_RECORD_BUFFER_BYTES", 64 * 1024 * 1024, minimum=1
            ),
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


def long_prompt_tokens_from_env() -> int:
    """Prompts of at least this many tokens run apart from short requests in pools of three
    replicas or more (docs/gateway-scheduling.md, "Long prompts"); 0 turns lanes off. Every
    process that acquires (gateways, batchers) must agree: the pool records it."""
    return env_int("SWITCHYARD_GATEWAY_LONG_PROMPT_TOKENS", DEFAULT_LONG_PROMPT_TOKENS, minimum=0)
