"""Build the gateway's policy snapshot from the database and publish it to Valkey."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Literal, cast

import valkey
from django.conf import settings
from django.db.models import Prefetch
from django.utils import timezone

from gateway.policy import (
    SCHEMA,
    VERSION_KEY,
    GuardrailEntry,
    KeyEntry,
    LifecycleEntry,
    ModelEntry,
    PriorityClassEntry,
    RateLimitEntry,
    RoutingEntry,
    ServiceAccountEntry,
    SnapshotDocument,
    UseCaseEntry,
    snapshot_write,
)
from governance.choices import ApiKeyStatus, ModelStatus, UseCaseStatus
from governance.job_keys import (
    DEFAULT_JOB_KEY_CLASS,
    PLAYGROUND_KEY_PREFIX,
    job_key_hash,
    job_key_prefix,
    playground_key_expiry,
    playground_key_hash,
    playground_period,
)
from governance.models import (
    ApiKey,
    Deployment,
    GuardrailSelection,
    Model,
    PriorityClass,
    PriorityRule,
    RateLimitPolicy,
    SlaClass,
    UseCase,
)
from runtime.valkey_urls import sync_client

logger = logging.getLogger(__name__)

PUBLISH_LOCK_KEY = "switchyard:policy:publish-lock"

# Publishes are serialised by a short lock so that a slow publisher can never overwrite a
# newer snapshot with an older one; inside it the document and its version are written in one
# MULTI, and the gateway reads the document only after it sees the version move.


def _models() -> dict[str, ModelEntry]:
    models: dict[str, ModelEntry] = {}
    for model in Model.objects.select_related("successor").prefetch_related(
        Prefetch("deployments", queryset=Deployment.objects.filter(active=True))
    ):
        deployments = list(model.deployments.all())
        if not deployments and model.status == ModelStatus.ACTIVE:
            continue  # a model with nowhere to run is not offered to clients
        # A deprecated or retired one stays known, deployed or not: the gateway answers 410
        # (or hands it to its successor) rather than 404.
        versions: dict[str, list[Deployment]] = {}
        for deployment in deployments:
            if deployment.version:
                versions.setdefault(deployment.version, []).append(deployment)
        if not versions:
            models[model.public_id] = _model_entry(model, deployments)
            continue
        # A model with versions: each version is a pool of its own, ``<model>@<version>``
        # ("@" is never in a public id), and the model's ``routing`` says how to choose one.
        # Its entry still lists every deployment: a gateway from before versions, still
        # running during an upgrade, serves the model on all of them rather than not at all.
        models[model.public_id] = _model_entry(model, deployments)
        models[model.public_id]["routing"] = _routing(model, list(versions))
        for version, serving in versions.items():
            entry = _model_entry(model, serving)
            entry["version_of"] = model.public_id
            entry["version"] = version
            models[f"{model.public_id}@{version}"] = entry
    return models


def _model_entry(model: Model, deployments: list[Deployment]) -> ModelEntry:
    entry: ModelEntry = {
        "served_name": deployments[0].served_name if deployments else model.public_id,
        "capabilities": list(model.capabilities),
        "replicas": [url for d in deployments for url in d.replicas],
        "timeout_s": model.timeout_seconds,
        "max_tokens": model.max_tokens,
        "max_in_flight_per_replica": min(
            (d.max_in_flight_per_replica for d in deployments), default=1
        ),
        "lora_adapters": sorted({a for d in deployments for a in d.lora_adapters}),
        # Deployments may serve the model under different names: the gateway renames
        # the request for the replica it is granted.
        "deployments": [
            {"served_name": d.served_name, "replicas": list(d.replicas)} for d in deployments
        ],
    }
    if model.status != ModelStatus.ACTIVE:
        entry["lifecycle"] = _lifecycle(model)
    return entry


def _routing(model: Model, versions: list[str]) -> RoutingEntry:
    """The model's routing as the gateway applies it: only versions that are deployed now,
    and a split that always names one (with none set, the version deployed first)."""
    routing = model.routing or {}
    split = [
        [version, int(weight)]
        for version, weight in sorted(routing.get("split", {}).items())
        if version in versions and int(weight) > 0
    ]
    return {
        "versions": sorted(versions),
        "split": cast(list[tuple[str, int]], split or [[versions[0], 1]]),
        "sticky": cast(Literal["request", "use_case"], routing.get("sticky", "request")),
        "aliases": {
            alias: version
            for alias, version in sorted(routing.get("aliases", {}).items())
            if version in versions
        },
    }


def _lifecycle(model: Model) -> LifecycleEntry:
    deprecated_at = model.deprecated_at or model.updated_at
    return {
        "status": cast(Literal["deprecated", "retired"], model.status),
        "deprecated_at": deprecated_at.timestamp(),
        "sunset_at": model.sunset_at.timestamp() if model.sunset_at else None,
        "successor": model.successor.public_id if model.successor else None,
        "notice_url": model.notice_url,
        "at_sunset": cast(Literal["refuse", "successor"], model.at_sunset),
    }


def _use_cases() -> dict[str, UseCaseEntry]:
    """Approved use cases, each with its guardrails in the order they run, what to do when
    one cannot run (``guardrail_failure``) and what to keep of each request (``record``): the
    contract the gateway enforces."""
    entries: dict[str, UseCaseEntry] = {}
    approved = UseCase.objects.filter(status=UseCaseStatus.APPROVED).select_related("tenant")
    in_order = GuardrailSelection.objects.order_by("position", "pk")
    for use_case in approved.prefetch_related(
        Prefetch("guardrails", queryset=in_order), "allowed_models"
    ):
        guardrails: list[GuardrailEntry] = [
            cast(
                GuardrailEntry,
                {
                    "guardrail": g.guardrail,
                    "side": g.side,
                    "action": g.action,
                    "config": dict(g.config),
                },
            )
            for g in use_case.guardrails.all()
        ]
        entries[str(use_case.pk)] = cast(
            UseCaseEntry,
            {
                "tenant": use_case.tenant.slug,
                "slug": use_case.slug,
                "limits": {
                    "requests_per_minute": use_case.requests_per_minute,
                    "tokens_per_minute": use_case.tokens_per_minute,
                    "tokens_per_day": use_case.tokens_per_day,
                    "max_concurrent": use_case.max_concurrent,
                },
                "guardrails": guardrails,
                "guardrail_failure": use_case.guardrail_failure,
                # What the gateway captures of each request (issue 12).
                "record": use_case.record_policy,
                # How long async results live and whether they are cached (docs/async.md).
                "async_tasks": {
                    "result_ttl_s": use_case.async_result_ttl_seconds,
                    "cache_s": use_case.async_cache_seconds,
                    # Whether a signing secret is set: a task's callback_url needs one.
                    "signed_callbacks": bool(use_case.webhook_secret_sealed),
                },
            },
        )
        if use_case.model_pins:
            entries[str(use_case.pk)]["model_pins"] = dict(use_case.model_pins)
        fallbacks = _fallbacks(use_case)
        if fallbacks:
            entries[str(use_case.pk)]["model_fallbacks"] = fallbacks
    return entries


def _fallbacks(use_case: UseCase) -> dict[str, list[str]]:
    """The use case's fallback chains, each keeping only models it may still call (a model
    taken off its list since leaves its chains, and the gateway never meets it)."""
    allowed = {model.public_id for model in use_case.allowed_models.all()}
    chains = {
        model: [name for name in chain if name in allowed]
        for model, chain in (use_case.model_fallbacks or {}).items()
        if model in allowed
    }
    return {model: chain for model, chain in chains.items() if chain}


def _priority() -> tuple[dict[str, PriorityClassEntry], dict[tuple[str, str], str]]:
    classes: dict[str, PriorityClassEntry] = {}
    for pc in PriorityClass.objects.all():
        classes[pc.name] = {
            "rank": pc.rank,
            "vllm_priority": pc.vllm_priority,
            "queue_timeout_s": pc.queue_timeout_seconds,
            "max_queue_length": pc.max_queue_length,
            "max_pool_share": pc.max_pool_share,
        }
        if pc.degrade_after_seconds is not None:
            classes[pc.name]["degrade_after_s"] = pc.degrade_after_seconds
    matrix = {
        (rule.environment, rule.namespace): rule.priority_class.name
        for rule in PriorityRule.objects.select_related("priority_class")
    }
    return classes, matrix


def _rate_limits() -> list[RateLimitEntry]:
    return [
        cast(
            RateLimitEntry,
            {
                "name": policy.name,
                "scope": policy.scope,
                "model": policy.model.public_id if policy.model else None,
                "tenant": policy.tenant.slug if policy.tenant else None,
                "requests_per_minute": policy.requests_per_minute,
                "tokens_per_minute": policy.tokens_per_minute,
                "tokens_per_day": policy.tokens_per_day,
            },
        )
        for policy in RateLimitPolicy.objects.select_related("model", "tenant")
    ]


def _service_accounts(matrix: dict[tuple[str, str], str]) -> dict[str, ServiceAccountEntry]:
    """Keycloak clients bound to approved use cases: what their tokens act as at the gateway.

    A suspended, retired or not yet approved use case is left out, so its client's tokens
    stop at the next refresh exactly as its keys do.
    """
    bound = (
        UseCase.objects.filter(status=UseCaseStatus.APPROVED)
        .exclude(service_account_client_id="")
        .select_related("tenant")
        .prefetch_related("allowed_models")
    )
    return {
        use_case.service_account_client_id: cast(
            ServiceAccountEntry,
            _caller(use_case, matrix.get((use_case.tenant.environment, use_case.namespace))),
        )
        for use_case in bound
    }


def _caller(use_case: UseCase, priority_class: str | None) -> dict[str, object]:
    """What every principal of a use case carries (keys, service accounts, job keys): who it
    acts as, what it may call, the class it is queued at."""
    return {
        "tenant": use_case.tenant.slug,
        "tenant_id": use_case.tenant_id,
        "environment": use_case.tenant.environment,
        "use_case": use_case.slug,
        "use_case_id": use_case.pk,
        "namespace": use_case.namespace,
        "models": sorted(m.public_id for m in use_case.allowed_models.all()),
        "priority_class": priority_class,
    }


def _job_keys(priority_classes: Mapping[str, PriorityClassEntry]) -> dict[str, KeyEntry]:
    """One key per SLA class of an approved use case (governance/job_keys.py): its file jobs
    call the gateway with it, as the use case, at the class's own priority class."""
    classes = (
        SlaClass.objects.filter(use_case__status=UseCaseStatus.APPROVED)
        .select_related("use_case__tenant", "priority_class")
        .prefetch_related("use_case__allowed_models")
    )
    entries: dict[str, KeyEntry] = {}
    for sla_class in classes:
        use_case = sla_class.use_case
        if sla_class.priority_class.name not in priority_classes:
            continue
        entries[job_key_hash(use_case.pk, sla_class.pk)] = _job_key_entry(
            use_case, sla_class.name, sla_class.priority_class.name
        )
    entries.update(_default_job_keys(priority_classes))
    return entries


def _default_job_keys(priority_classes: Mapping[str, PriorityClassEntry]) -> dict[str, KeyEntry]:
    """One key per approved use case for registrations with an explicit deadline and no SLA
    class (SLA class id 0 in the derivation): they run at the lowest-ranked priority class,
    the batch class, so they soak up idle capacity only."""
    if not priority_classes:
        return {}
    lowest = max(priority_classes, key=lambda name: priority_classes[name]["rank"])
    entries: dict[str, KeyEntry] = {}
    use_cases = (
        UseCase.objects.filter(status=UseCaseStatus.APPROVED)
        .select_related("tenant")
        .prefetch_related("allowed_models")
    )
    for use_case in use_cases:
        entries[job_key_hash(use_case.pk, DEFAULT_JOB_KEY_CLASS)] = _job_key_entry(
            use_case, "default", lowest
        )
    return entries


def _job_key_entry(use_case: UseCase, class_name: str, priority_class: str) -> KeyEntry:
    """A job key's principal: the use case, no key id, the class it runs at."""
    return cast(
        KeyEntry,
        {
            "key_id": None,
            "prefix": job_key_prefix(class_name),
            "expires_at": None,
            **_caller(use_case, priority_class),
        },
    )


def _playground_keys(matrix: Mapping[tuple[str, str], str], now: float) -> dict[str, KeyEntry]:
    """The portal playground's keys of each approved use case (governance/job_keys.py), for
    this period and the next: the use case's own models, limits, guardrails and priority
    class, like its keys, each expiring with its period."""
    use_cases = (
        UseCase.objects.filter(status=UseCaseStatus.APPROVED)
        .select_related("tenant")
        .prefetch_related("allowed_models")
    )
    current = playground_period(now)
    entries: dict[str, KeyEntry] = {}
    for use_case in use_cases:
        caller = _caller(use_case, matrix.get((use_case.tenant.environment, use_case.namespace)))
        for period in (current, current + 1):
            entries[playground_key_hash(use_case.pk, period)] = cast(
                KeyEntry,
                {
                    "key_id": None,
                    "prefix": PLAYGROUND_KEY_PREFIX,
                    "expires_at": playground_key_expiry(period),
                    **caller,
                },
            )
    return entries


def snapshot_build(*, version: int) -> SnapshotDocument:
    priority_classes, matrix = _priority()
    keys: dict[str, KeyEntry] = {}
    now = timezone.now()
    live_keys = (
        ApiKey.objects.filter(
            status=ApiKeyStatus.ACTIVE,
            key_hash__isnull=False,
            use_case__status=UseCaseStatus.APPROVED,
        )
        .exclude(expires_at__lte=now)
        .select_related("use_case__tenant")
        .prefetch_related("use_case__allowed_models")
    )
    for key in live_keys:
        use_case = key.use_case
        assert key.key_hash is not None
        keys[key.key_hash] = cast(
            KeyEntry,
            {
                "key_id": key.pk,
                "prefix": key.prefix,
                "expires_at": key.expires_at.timestamp() if key.expires_at else None,
                **_caller(use_case, matrix.get((use_case.tenant.environment, use_case.namespace))),
            },
        )
    keys.update(_job_keys(priority_classes))
    keys.update(_playground_keys(matrix, now.timestamp()))
    return {
        "schema": SCHEMA,
        "version": version,
        "published_at": time.time(),
        "models": _models(),
        "keys": keys,
        "service_accounts": _service_accounts(matrix),
        "use_cases": _use_cases(),
        "priority_classes": priority_classes,
        "rate_limits": _rate_limits(),
    }


def snapshot_publish(*, client: valkey.Valkey | None = None) -> int:
    """Publish a fresh snapshot; returns its version."""
    client = client or sync_client(settings.VALKEY_URL)
    with client.lock(PUBLISH_LOCK_KEY, timeout=30, blocking_timeout=30):
        version = int(cast(bytes | None, client.get(VERSION_KEY)) or 0) + 1
        document = snapshot_build(version=version)
        snapshot_write(client, document)
    logger.info(
        "policy_snapshot_published version=%s models=%s keys=%s service_accounts=%s",
        version,
        len(document["models"]),
        len(document["keys"]),
        len(document.get("service_accounts", {})),
    )
    return version
