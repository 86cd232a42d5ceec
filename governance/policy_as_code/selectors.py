"""Read the database's governance records as a policy document: what ``plan`` compares against."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Prefetch, Q
from django.utils import timezone

from governance.choices import ApiKeyStatus
from governance.models import (
    ApiKey,
    Deployment,
    GuardrailSelection,
    Model,
    ModelPrice,
    PriorityClass,
    PriorityRule,
    RateLimitPolicy,
    SlaClass,
    Tenant,
    UseCase,
)
from governance.policy_as_code.errors import PolicyInvalid, Problem
from governance.policy_as_code.schema import (
    AsyncTasksSpec,
    DeploymentSpec,
    GuardrailSpec,
    KeySpec,
    LifecycleSpec,
    LimitsSpec,
    ModelSpec,
    PolicyDocument,
    PriorityClassSpec,
    RateLimitSpec,
    RecordsSpec,
    SlaClassSpec,
    TenantSpec,
    UseCaseSpec,
)
from governance.prices import price_of
from governance.selectors import legal_hold_reason


def _deployments(model: Model) -> tuple[DeploymentSpec, ...]:
    specs: dict[str, DeploymentSpec] = {}
    for deployment in model.deployments.all():
        if deployment.served_name in specs:
            # Policy as code names a deployment by its model and served name; two rows that
            # share both cannot be told apart in a file, so say so rather than drop one.
            raise PolicyInvalid(
                [
                    Problem(
                        f"models[{model.public_id}].deployments[{deployment.served_name}]",
                        "the database holds two deployments of this model with this served "
                        "name; merge or rename one before using policy as code",
                    )
                ]
            )
        specs[deployment.served_name] = DeploymentSpec(
            served_name=deployment.served_name,
            replicas=tuple(deployment.replicas),
            node_pool=deployment.node_pool,
            version=deployment.version,
            lora_adapters=tuple(deployment.lora_adapters),
            max_in_flight_per_replica=deployment.max_in_flight_per_replica,
            active=deployment.active,
        )
    return tuple(specs[name] for name in sorted(specs))


def _routing(routing: Any) -> dict[str, Any]:
    """The stored routing in the form the file's is compared in (``clean_routing``'s: empty
    members and the default ``sticky: request`` left out), whatever wrote it."""
    if not isinstance(routing, dict):
        return {}
    canonical: dict[str, Any] = {}
    for member in ("split", "aliases"):
        if routing.get(member):
            canonical[member] = dict(sorted(routing[member].items()))
    if routing.get("sticky", "request") != "request":
        canonical["sticky"] = routing["sticky"]
    return canonical


def _fallbacks(use_case: UseCase) -> dict[str, tuple[str, ...]]:
    """The chains as the gateway is given them (``governance.snapshot``): a model taken off the
    use case's list since has left them, so the file never names a model it may not call."""
    allowed = {model.public_id for model in use_case.allowed_models.all()}
    chains = {
        model: tuple(name for name in chain if name in allowed)
        for model, chain in (use_case.model_fallbacks or {}).items()
        if model in allowed
    }
    return {model: chains[model] for model in sorted(chains) if chains[model]}


def _use_case(use_case: UseCase) -> UseCaseSpec:
    return UseCaseSpec(
        tenant=use_case.tenant.slug,
        slug=use_case.slug,
        name=use_case.name,
        kind=use_case.kind,
        purpose=use_case.purpose,
        status=use_case.status,
        status_reason=use_case.status_reason,
        data_classification=use_case.data_classification,
        namespace=use_case.namespace,
        ticket_ref=use_case.ticket_ref,
        service_account_client_id=use_case.service_account_client_id,
        guardrail_failure=use_case.guardrail_failure,
        models=tuple(sorted(m.public_id for m in use_case.allowed_models.all())),
        model_pins=dict(sorted((use_case.model_pins or {}).items())),
        model_fallbacks=_fallbacks(use_case),
        limits=LimitsSpec(
            requests_per_minute=use_case.requests_per_minute,
            tokens_per_minute=use_case.tokens_per_minute,
            tokens_per_day=use_case.tokens_per_day,
            max_concurrent=use_case.max_concurrent,
        ),
        guardrails=tuple(
            GuardrailSpec(
                guardrail=g.guardrail,
                side=g.side,
                action=g.action,
                config=dict(g.config),
                position=g.position,
            )
            for g in sorted(use_case.guardrails.all(), key=lambda g: (g.position, g.pk))
        ),
        records=RecordsSpec(
            policy=use_case.record_policy,
            retention_days=use_case.record_retention_days,
            developers_can_read=use_case.records_visible_to_developers,
        ),
        async_tasks=AsyncTasksSpec(
            result_ttl_seconds=use_case.async_result_ttl_seconds,
            cache_seconds=use_case.async_cache_seconds,
        ),
        legal_hold=use_case.legal_hold,
        legal_hold_reason=legal_hold_reason(use_case),
        sla_classes=tuple(
            SlaClassSpec(
                name=sla.name,
                description=sla.description,
                turnaround_seconds=sla.turnaround_seconds,
                windows=tuple(dict(w) for w in sla.windows or ()),
                time_zone=sla.time_zone,
                priority_class=sla.priority_class.name,
                max_file_bytes=sla.max_file_bytes,
                kinds=tuple(sla.kinds),
            )
            for sla in sorted(use_case.sla_classes.all(), key=lambda sla: sla.name)
        ),
    )


def _live_keys(now: datetime) -> tuple[KeySpec, ...]:
    """(use case, name) of every key that works now: active, revealed and not expired."""
    rows = (
        ApiKey.objects.filter(status=ApiKeyStatus.ACTIVE, key_hash__isnull=False)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .values_list("use_case__tenant__slug", "use_case__slug", "name")
        .distinct()
    )
    return tuple(
        KeySpec(use_case=f"{tenant}/{slug}", name=name) for tenant, slug, name in sorted(set(rows))
    )


def policy_current(*, now: datetime | None = None) -> PolicyDocument:
    """Every governance record policy as code manages, every section present, in stable order."""
    models = (
        Model.objects.select_related("successor")
        .prefetch_related(
            Prefetch("deployments", queryset=Deployment.objects.order_by("id")),
            Prefetch("prices", queryset=ModelPrice.objects.order_by("effective_from")),
        )
        .order_by("public_id")
    )
    use_cases = (
        UseCase.objects.select_related("tenant")
        .prefetch_related(
            Prefetch("allowed_models", queryset=Model.objects.only("public_id")),
            Prefetch("guardrails", queryset=GuardrailSelection.objects.all()),
            Prefetch("sla_classes", queryset=SlaClass.objects.select_related("priority_class")),
        )
        .order_by("tenant__slug", "slug")
    )
    matrix: dict[str, dict[str, str]] = {}
    for rule in PriorityRule.objects.select_related("priority_class"):
        matrix.setdefault(rule.environment, {})[rule.namespace] = rule.priority_class.name
    return PolicyDocument(
        models=tuple(
            ModelSpec(
                id=model.public_id,
                description=model.description,
                capabilities=tuple(model.capabilities),
                timeout_seconds=float(model.timeout_seconds),
                max_tokens=model.max_tokens,
                deployments=_deployments(model),
                prices=tuple(price_of(row) for row in model.prices.all()),
                lifecycle=LifecycleSpec(
                    status=model.status,
                    sunset_at=model.sunset_at,
                    successor=model.successor.public_id if model.successor else None,
                    notice_url=model.notice_url,
                    at_sunset=model.at_sunset,
                ),
                routing=_routing(model.routing),
            )
            for model in models
        ),
        tenants=tuple(
            TenantSpec(
                id=tenant.slug,
                name=tenant.name,
                business_unit=tenant.business_unit,
                application_id=tenant.application_id,
                environment=tenant.environment,
                owner_email=tenant.owner_email,
                contacts=tuple(tenant.contacts),
                legal_hold=tenant.legal_hold,
                legal_hold_reason=legal_hold_reason(tenant),
            )
            for tenant in Tenant.objects.order_by("slug")
        ),
        use_cases=tuple(_use_case(use_case) for use_case in use_cases),
        priority_classes=tuple(
            PriorityClassSpec(
                name=pc.name,
                rank=pc.rank,
                vllm_priority=pc.vllm_priority,
                queue_timeout_seconds=float(pc.queue_timeout_seconds),
                max_queue_length=pc.max_queue_length,
                max_pool_share=float(pc.max_pool_share),
                degrade_after_seconds=pc.degrade_after_seconds,
            )
            for pc in PriorityClass.objects.order_by("rank")
        ),
        priority_matrix=matrix,
        rate_limits=tuple(
            RateLimitSpec(
                name=policy.name,
                scope=policy.scope,
                model=policy.model.public_id if policy.model else None,
                tenant=policy.tenant.slug if policy.tenant else None,
                requests_per_minute=policy.requests_per_minute,
                tokens_per_minute=policy.tokens_per_minute,
                tokens_per_day=policy.tokens_per_day,
            )
            for policy in RateLimitPolicy.objects.select_related("model", "tenant").order_by("name")
        ),
        keys=_live_keys(now or timezone.now()),
    )
