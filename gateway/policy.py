"""The policy snapshot: governance's decisions, published to Valkey, read by the gateway.

Governance (Django) builds and publishes it on every change that affects the hot path; the
gateway keeps a parsed copy in memory and refreshes it when the version key moves, so a
request never waits on the database or on Valkey to authenticate.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Literal, NotRequired, TypedDict, cast

import orjson
import valkey

from gateway.guardrail_plan import GuardPlan, plan_guardrails
from runtime.valkey_urls import transaction

# One hash tag: written together in one MULTI, which a Valkey Cluster allows in one slot only.
SNAPSHOT_KEY = "switchyard:{policy}:snapshot"
VERSION_KEY = "switchyard:{policy}:version"
SCHEMA = 1

RecordPolicy = Literal["none", "metadata", "full"]
RECORD_POLICIES: frozenset[str] = frozenset(("none", "metadata", "full"))
DEFAULT_RECORD_POLICY: RecordPolicy = "metadata"

# "guard": a guard model (Llama Guard's prompt format) that fleet-run guardrails ask.
ModelCapability = Literal["chat", "completions", "embeddings", "transcription", "guard"]


class DeploymentEntry(TypedDict):
    served_name: str
    replicas: list[str]


class LifecycleEntry(TypedDict):
    """A model that is no longer simply active (docs/models.md). Times are epoch seconds."""

    status: Literal["deprecated", "retired"]
    deprecated_at: float
    sunset_at: float | None
    successor: str | None
    notice_url: str
    at_sunset: Literal["refuse", "successor"]


class RoutingEntry(TypedDict):
    """How a model with versions chooses one (governance/model_routing.py)."""

    versions: list[str]
    split: list[tuple[str, int]]  # (version, weight > 0); never empty
    sticky: Literal["request", "use_case"]
    aliases: dict[str, str]


class ModelEntry(TypedDict):
    served_name: str  # the first deployment's (what snapshots without ``deployments`` had)
    capabilities: list[ModelCapability]
    replicas: list[str]  # every deployment's
    timeout_s: float
    max_tokens: int | None
    max_in_flight_per_replica: NotRequired[int]
    lora_adapters: NotRequired[list[str]]
    # Which replicas serve under which name. A model deployed twice may be served under two
    # names; absent from older snapshots: every replica then serves ``served_name``.
    deployments: NotRequired[list[DeploymentEntry]]
    # Only for a deprecated or retired model: an active one costs the snapshot nothing.
    lifecycle: NotRequired[LifecycleEntry]
    # A model with versions: how to choose one; its versions are entries of their own,
    # ``<model>@<version>``, each with ``version_of`` and ``version`` (issue 27).
    routing: NotRequired[RoutingEntry]
    version_of: NotRequired[str]
    version: NotRequired[str]


class LimitsEntry(TypedDict):
    requests_per_minute: int | None
    tokens_per_minute: int | None
    tokens_per_day: int | None
    max_concurrent: NotRequired[int | None]


class GuardrailEntry(TypedDict):
    guardrail: str
    side: Literal["request", "response", "both"]
    action: Literal["block", "redact", "flag"]
    config: dict[str, object]


class AsyncTasksEntry(TypedDict):
    result_ttl_s: int
    cache_s: int
    signed_callbacks: NotRequired[bool]


class UseCaseEntry(TypedDict):
    tenant: str
    slug: str
    limits: LimitsEntry
    guardrails: list[GuardrailEntry]  # in the order they run
    # What happens when a guardrail cannot run: "closed" (503, the default) or "open" (let
    # through, recorded as failed_open). Absent from snapshots before issue 11.
    guardrail_failure: NotRequired[Literal["closed", "open"]]
    # What is kept of each request (issue 12): "none", "metadata" (no content; the default,
    # also for snapshots before issue 12) or "full" (the request and response too).
    record: NotRequired[RecordPolicy]
    # Async tasks (issue 14): how long results live and the result cache, in seconds.
    # Absent from snapshots before issue 14 (then the defaults of ``UseCase``).
    async_tasks: NotRequired[AsyncTasksEntry]
    # {model: version or alias} the use case is pinned to (issue 27); absent when none.
    model_pins: NotRequired[dict[str, str]]
    # {model: [fallback models, in order]} (issue 27); absent when none.
    model_fallbacks: NotRequired[dict[str, list[str]]]


class PriorityClassEntry(TypedDict):
    rank: int
    vllm_priority: int
    queue_timeout_s: float
    max_queue_length: int
    # The most of a model pool's slots the class may hold at once (0 < share ≤ 1); absent
    # from snapshots before issue 13: all of it.
    max_pool_share: NotRequired[float]
    # With a fallback: how long a request waits on a saturated model before falling back
    # (issue 27); absent: only when refused (queue full or timeout).
    degrade_after_s: NotRequired[float]


class RateLimitEntry(LimitsEntry):
    name: str
    scope: Literal["global", "model", "tenant", "tenant_model"]
    model: str | None
    tenant: str | None


class KeyEntry(TypedDict):
    key_id: int | None  # None: a file job's derived key (governance/job_keys.py)
    prefix: str
    tenant: str
    tenant_id: int
    environment: str
    use_case: str
    use_case_id: int
    namespace: str
    models: list[str]
    expires_at: float | None
    priority_class: NotRequired[str | None]


class ServiceAccountEntry(TypedDict):
    """A Keycloak client bound to an approved use case (keyed by client id): what its
    service-account tokens act as, the same fields as a key's less the key's own."""

    tenant: str
    tenant_id: int
    environment: str
    use_case: str
    use_case_id: int
    namespace: str
    models: list[str]
    priority_class: str | None


class SnapshotDocument(TypedDict):
    schema: int
    version: int
    published_at: float
    models: dict[str, ModelEntry]
    keys: dict[str, KeyEntry]
    # Absent from snapshots published before service accounts existed: none then.
    service_accounts: NotRequired[dict[str, ServiceAccountEntry]]
    use_cases: NotRequired[dict[str, UseCaseEntry]]
    priority_classes: NotRequired[dict[str, PriorityClassEntry]]
    rate_limits: NotRequired[list[RateLimitEntry]]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: everything the gateway needs to decide, resolved from one key hash or
    one service account's client id (then ``key_id`` is None and ``key_prefix`` "sa:<client>")."""

    key_id: int | None
    key_prefix: str
    tenant: str
    tenant_id: int
    environment: str
    use_case: str
    use_case_id: int
    namespace: str
    models: frozenset[str]
    expires_at: float | None
    priority_class: str | None = None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


@dataclass(frozen=True, slots=True)
class Model:
    public_id: str
    served_name: str
    capabilities: frozenset[str]
    replicas: tuple[str, ...]
    timeout_s: float
    max_tokens: int | None
    # The gateway never sends one replica more than this at once (the scheduler's cap).
    max_in_flight_per_replica: int = 64
    # Replica -> served name, only when the model's deployments serve it under different
    # names (then the body is renamed once the replica is known); else ``served_name``.
    served_names: Mapping[str, str] = field(default_factory=dict)
    # Deprecated or retired (None: active, the one check a request pays).
    lifecycle: Lifecycle | None = None
    # Headers every answer served by this model carries (the deprecation notices,
    # ``x-switchyard-served-model`` when a successor serves under an old id, and
    # ``x-switchyard-model-version`` for a version), made once.
    notices: tuple[tuple[bytes, bytes], ...] = ()
    # A version of a model (issue 27): ``public_id`` is its pool, ``<model>@<version>``,
    # which records, usage and metrics name; ``family`` the public model, which grants and
    # rate limits name. "" for a model without versions.
    family: str = ""
    version: str = ""
    # A model with versions: how a request to it chooses one (gateway/model_routing.py).
    routing: Routing | None = None

    def served_name_for(self, replica: str) -> str:
        return self.served_names.get(replica, self.served_name)

    @property
    def base(self) -> str:
        """The public model this is (a version's model, else itself)."""
        return self.family or self.public_id


class SplitWheel:
    """Smooth weighted round robin (nginx's): over any run of requests each version's share
    is within one request of its weight's, and versions interleave (95/5 sends one request
    in twenty, not five in a row). One per snapshot and process; not shared across
    gateways, each of which is exact on its own.

    The sequence repeats every sum-of-weights picks (after dividing by their common
    divisor), so one cycle is worked out once and a pick is an index step."""

    __slots__ = ("_current", "_cycle", "_i", "_names", "_weights")

    #: the longest cycle kept (each pick's version name); past it, picks are worked out
    MAX_CYCLE = 4096

    def __init__(self, split: tuple[tuple[str, int], ...]) -> None:
        self._names = [name for name, _ in split]
        self._weights = [weight for _, weight in split]
        divisor = math.gcd(*self._weights)
        weights = [weight // divisor for weight in self._weights]
        current = [0] * len(weights)
        cycle = (
            [self._pick(weights, current) for _ in range(sum(weights))]
            if sum(weights) <= self.MAX_CYCLE
            else []
        )
        self._cycle = cycle or None
        self._i = -1
        self._current = current

    def _pick(self, weights: list[int], current: list[int]) -> str:
        best = 0
        for i, weight in enumerate(weights):
            current[i] += weight
            if current[i] > current[best]:
                best = i
        current[best] -= sum(weights)
        return self._names[best]

    def next(self) -> str:
        cycle = self._cycle
        if cycle is None:
            return self._pick(self._weights, self._current)
        self._i = i = (self._i + 1) % len(cycle)
        return cycle[i]

    def by_hash(self, key: str) -> str:
        """The version a sticky key always gets: its hash's place in the weights."""
        point = zlib.crc32(key.encode()) % sum(self._weights)
        for name, weight in zip(self._names, self._weights, strict=True):
            if point < weight:
                return name
            point -= weight
        return self._names[-1]


@dataclass(frozen=True, slots=True)
class Routing:
    versions: frozenset[str]
    split: tuple[tuple[str, int], ...]
    sticky: str
    aliases: Mapping[str, str]
    wheel: SplitWheel = field(compare=False, repr=False)
    # Version -> its pool's snapshot entry, ``<model>@<version>``, made once.
    pools: Mapping[str, str] = field(default_factory=dict)

    def target(self, label: str) -> str | None:
        """The version ``label`` (a version or an alias) names, if it is deployed."""
        version = self.aliases.get(label, label)
        return version if version in self.versions else None


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """A deprecated or retired model's lifecycle, as the gateway applies it by its own clock.

    A retired model, or a deprecated one at or past its sunset, is refused (410 naming the
    successor) or, where the officer chose it, served by its successor under the old id:
    then the answer carries ``successor_notices``."""

    status: str
    sunset_at: float | None
    successor: str | None
    at_sunset: str
    successor_notices: tuple[tuple[bytes, bytes], ...] = ()

    def ended(self, now: float) -> bool:
        return self.status == "retired" or (self.sunset_at is not None and now >= self.sunset_at)


@dataclass(frozen=True, slots=True)
class Limits:
    """A set of limits; ``None`` means "no limit" on that axis."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    max_concurrent: int | None = None


@dataclass(frozen=True, slots=True)
class Guardrail:
    guardrail: str
    side: str
    action: str
    config: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class UseCase:
    id: int
    tenant: str
    slug: str
    limits: Limits
    guardrails: tuple[Guardrail, ...] = ()
    guardrail_failure: str = "closed"
    record: RecordPolicy = DEFAULT_RECORD_POLICY
    # Async tasks: how long a result stays readable after the task ends, and for how long
    # an identical deterministic task may reuse it (0: no cache).
    async_result_ttl_s: int = 600
    async_cache_s: int = 0
    # Whether the use case has a webhook signing secret: a task's ``callback_url`` is signed
    # with it (Standard Webhooks, scheduler/files/webhooks.py), so a task may ask for one only then.
    async_signed_callbacks: bool = False
    # {model: version or alias}: the version this use case always gets (issue 27).
    model_pins: Mapping[str, str] = field(default_factory=dict)
    # {model: fallback models in order}: who serves when the model refuses for capacity.
    model_fallbacks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A service class. ``rank`` 0 is served first; ``vllm_priority`` goes upstream as is."""

    name: str
    rank: int
    vllm_priority: int
    queue_timeout_s: float
    max_queue_length: int
    max_pool_share: float = 1.0
    degrade_after_s: float | None = None

    @property
    def pool_share_permille(self) -> int:
        """The share as acquire.lua takes it: thousandths, at least 1."""
        return max(1, min(1000, round(self.max_pool_share * 1000)))


RateLimitScope = Literal["global", "model", "tenant", "tenant_model"]


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A RateLimitPolicy row: applies to everyone (global), one model, one tenant, or both."""

    name: str
    scope: RateLimitScope
    model: str | None
    tenant: str | None
    limits: Limits


@dataclass(frozen=True, slots=True)
class Policy:
    version: int
    loaded_at: float
    models: dict[str, Model] = field(default_factory=dict)
    principals: dict[str, Principal] = field(default_factory=dict)
    service_accounts: Mapping[str, Principal] = field(default_factory=dict)  # by client id
    use_cases: dict[int, UseCase] = field(default_factory=dict)  # by UseCase id
    priority_classes: dict[str, PriorityClass] = field(default_factory=dict)  # by name
    rate_limits: tuple[RateLimit, ...] = ()
    # By UseCase id, only the use cases with at least one guardrail selected: the request
    # path's one lookup (a use case without any pays nothing else).
    guarded: Mapping[int, GuardPlan] = field(default_factory=dict)
    # By UseCase id, each use case's record policy: the request path's one lookup
    # (``record_policy``).
    records: Mapping[int, RecordPolicy] = field(default_factory=dict)
    # Every use case the snapshot still serves: its own entry, or a key or a client acting as
    # it. Governance leaves a suspended or retired one out of all of them, so work it asked
    # for earlier (a queued async task) finds it missing here.
    active_use_cases: frozenset[int] = frozenset()
    # By UseCase id, only use cases with pins: {model: version or alias}.
    pins: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    # By UseCase id, only use cases with fallback chains: {model: fallbacks in order}.
    fallbacks: Mapping[int, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)

    def use_case_active(self, use_case_id: int) -> bool:
        """Whether the use case is approved as of this snapshot."""
        return use_case_id in self.active_use_cases

    def record_policy(self, use_case_id: int) -> RecordPolicy:
        """What the use case's record policy keeps; "metadata" for one not in the snapshot."""
        return self.records.get(use_case_id, DEFAULT_RECORD_POLICY)

    def principal_for(self, key_hash: str) -> Principal | None:
        # Looking up by the SHA-256 of a 256-bit random key is safe against timing attacks:
        # what a timing difference could reveal is the hash, which does not lead to the key.
        return self.principals.get(key_hash)


def parse_snapshot(raw: bytes) -> Policy:
    """Parse a published snapshot; raises ValueError on anything malformed."""
    document = orjson.loads(raw)
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise ValueError(f"policy snapshot schema is not {SCHEMA}")
    models = {
        public_id: _model(public_id, entry) for public_id, entry in document["models"].items()
    }
    principals = {
        key_hash: Principal(
            key_id=entry["key_id"],
            key_prefix=entry["prefix"],
            tenant=entry["tenant"],
            tenant_id=entry["tenant_id"],
            environment=entry["environment"],
            use_case=entry["use_case"],
            use_case_id=entry["use_case_id"],
            namespace=entry["namespace"],
            models=frozenset(entry["models"]),
            expires_at=entry["expires_at"],
            priority_class=entry.get("priority_class"),
        )
        for key_hash, entry in document["keys"].items()
    }
    use_cases = {
        int(use_case_id): UseCase(
            id=int(use_case_id),
            tenant=entry["tenant"],
            slug=entry["slug"],
            limits=_limits(entry["limits"]),
            guardrails=tuple(
                Guardrail(
                    guardrail=g["guardrail"],
                    side=g["side"],
                    action=g["action"],
                    config=dict(g.get("config") or {}),
                )
                for g in entry.get("guardrails", [])
            ),
            guardrail_failure=entry.get("guardrail_failure", "closed"),
            record=_record_policy(entry.get("record", DEFAULT_RECORD_POLICY)),
            async_result_ttl_s=int(entry.get("async_tasks", {}).get("result_ttl_s", 600)),
            async_cache_s=int(entry.get("async_tasks", {}).get("cache_s", 0)),
            async_signed_callbacks=bool(
                entry.get("async_tasks", {}).get("signed_callbacks", False)
            ),
            model_pins=dict(entry.get("model_pins") or {}),
            model_fallbacks={
                model: tuple(chain) for model, chain in entry.get("model_fallbacks", {}).items()
            },
        )
        for use_case_id, entry in document.get("use_cases", {}).items()
    }
    service_accounts = {
        client_id: _service_account(client_id, entry)
        for client_id, entry in document.get("service_accounts", {}).items()
    }
    return Policy(
        version=int(document["version"]),
        loaded_at=time.monotonic(),
        models=models,
        principals=principals,
        service_accounts=service_accounts,
        use_cases=use_cases,
        active_use_cases=frozenset(
            (
                *use_cases,
                *(p.use_case_id for p in principals.values()),
                *(p.use_case_id for p in service_accounts.values()),
            )
        ),
        guarded={
            use_case_id: plan_guardrails(use_case.guardrails, use_case.guardrail_failure)
            for use_case_id, use_case in use_cases.items()
            if use_case.guardrails
        },
        records={use_case_id: use_case.record for use_case_id, use_case in use_cases.items()},
        pins={
            use_case_id: use_case.model_pins
            for use_case_id, use_case in use_cases.items()
            if use_case.model_pins
        },
        fallbacks={
            use_case_id: use_case.model_fallbacks
            for use_case_id, use_case in use_cases.items()
            if use_case.model_fallbacks
        },
        priority_classes={
            name: PriorityClass(
                name=name,
                rank=int(entry["rank"]),
                vllm_priority=int(entry["vllm_priority"]),
                queue_timeout_s=float(entry["queue_timeout_s"]),
                max_queue_length=int(entry["max_queue_length"]),
                max_pool_share=float(entry.get("max_pool_share", 1.0)),
                degrade_after_s=(
                    None
                    if entry.get("degrade_after_s") is None
                    else float(entry["degrade_after_s"])
                ),
            )
            for name, entry in document.get("priority_classes", {}).items()
        },
        rate_limits=tuple(
            RateLimit(
                name=entry["name"],
                scope=entry["scope"],
                model=entry.get("model"),
                tenant=entry.get("tenant"),
                limits=_limits(entry),
            )
            for entry in document.get("rate_limits", [])
        ),
    )


def _record_policy(value: object) -> RecordPolicy:
    if value not in RECORD_POLICIES:
        raise ValueError(f"record policy {value!r} is not one of none, metadata, full")
    return cast(RecordPolicy, value)


def _model(public_id: str, entry: ModelEntry) -> Model:
    served_names = {
        replica: deployment["served_name"]
        for deployment in entry.get("deployments", ())
        for replica in deployment["replicas"]
    }
    distinct = set(served_names.values())
    served_name = next(iter(distinct)) if len(distinct) == 1 else entry["served_name"]
    lifecycle = entry.get("lifecycle")
    routing = entry.get("routing")
    version = entry.get("version", "")
    notices = () if lifecycle is None else deprecation_headers(lifecycle)
    if version:
        notices += ((b"x-switchyard-model-version", version.encode()),)
    return Model(
        public_id=public_id,
        served_name=served_name,
        capabilities=frozenset(entry["capabilities"]),
        replicas=tuple(entry["replicas"]),
        timeout_s=float(entry["timeout_s"]),
        max_tokens=entry["max_tokens"],
        max_in_flight_per_replica=int(entry.get("max_in_flight_per_replica", 64)),
        served_names=served_names if len(distinct) > 1 else {},
        lifecycle=None if lifecycle is None else _lifecycle(lifecycle),
        notices=notices,
        family=entry.get("version_of", ""),
        version=version,
        routing=None if routing is None else _routing(public_id, routing),
    )


def _routing(public_id: str, entry: RoutingEntry) -> Routing:
    split = tuple((str(name), int(weight)) for name, weight in entry["split"])
    if not split or any(weight <= 0 for _, weight in split):
        raise ValueError("a model's split names no version, or a weight that is not positive")
    return Routing(
        versions=frozenset(entry["versions"]),
        split=split,
        sticky=entry.get("sticky", "request"),
        aliases=dict(entry.get("aliases", {})),
        wheel=SplitWheel(split),
        pools={version: f"{public_id}@{version}" for version in entry["versions"]},
    )


def _lifecycle(entry: LifecycleEntry) -> Lifecycle:
    status, at_sunset = entry["status"], entry["at_sunset"]
    if status not in ("deprecated", "retired") or at_sunset not in ("refuse", "successor"):
        raise ValueError(f"model lifecycle {status!r}/{at_sunset!r} is not known")
    sunset = entry["sunset_at"]
    successor = entry["successor"]
    notices = deprecation_headers(entry)
    if successor is not None:
        notices += ((b"x-switchyard-served-model", successor.encode()),)
    return Lifecycle(
        status=status,
        sunset_at=None if sunset is None else float(sunset),
        successor=successor,
        at_sunset=at_sunset,
        successor_notices=notices,
    )


def deprecation_headers(entry: LifecycleEntry) -> tuple[tuple[bytes, bytes], ...]:
    """``Deprecation`` (RFC 9745: a structured date, ``@<epoch seconds>``), ``Sunset``
    (RFC 8594: an HTTP date) and, with a notice, ``Link`` to it as ``rel="deprecation"``
    and ``rel="sunset"`` (RFC 9745 §3, RFC 8594 §6)."""
    headers = [(b"deprecation", b"@%d" % int(entry["deprecated_at"]))]
    if entry["sunset_at"] is not None:
        headers.append((b"sunset", formatdate(entry["sunset_at"], usegmt=True).encode()))
    url = entry["notice_url"]
    # A URL that could end the link or the header (governance validates it; never trusted).
    if url and url.isascii() and url.isprintable() and not set(url) & set('<> "'):
        for rel in ("deprecation", "sunset"):
            headers.append((b"link", f'<{url}>; rel="{rel}"; type="text/html"'.encode()))
    return tuple(headers)


def _service_account(client_id: str, entry: ServiceAccountEntry) -> Principal:
    return Principal(
        key_id=None,
        key_prefix=f"sa:{client_id}",
        tenant=entry["tenant"],
        tenant_id=entry["tenant_id"],
        environment=entry["environment"],
        use_case=entry["use_case"],
        use_case_id=entry["use_case_id"],
        namespace=entry["namespace"],
        models=frozenset(entry["models"]),
        expires_at=None,  # the token's own expiry is checked when it is verified
        priority_class=entry.get("priority_class"),
    )


def _limits(entry: LimitsEntry) -> Limits:
    def optional(value: int | None) -> int | None:
        return None if value is None else int(value)

    return Limits(
        requests_per_minute=optional(entry.get("requests_per_minute")),
        tokens_per_minute=optional(entry.get("tokens_per_minute")),
        tokens_per_day=optional(entry.get("tokens_per_day")),
        max_concurrent=optional(entry.get("max_concurrent")),
    )


def snapshot_write(client: valkey.Valkey, document: SnapshotDocument) -> None:
    """Write a snapshot and its version together (one MULTI): a gateway that sees the version
    move reads a document at least that new. Publishers serialise themselves (governance
    holds a lock), so versions only grow."""
    with transaction(client, SNAPSHOT_KEY) as pipe:  # (one slot on a Cluster)
        pipe.set(SNAPSHOT_KEY, orjson.dumps(document))
        pipe.set(VERSION_KEY, document["version"])
        pipe.execute()  # type: ignore[no-untyped-call]
