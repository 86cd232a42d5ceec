"""Write a policy document as a file: the database's state, in the format people write.

The output is stable (records sorted by id, fields in a fixed order, defaults left out) so an
export committed to git shows only real changes in a diff, and planning an export against the
database it came from shows none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from governance.choices import Environment, Namespace, RateLimitScope
from governance.policy_as_code.schema import (
    FORMAT_VERSION,
    USE_CASE_LIMIT_FIELDS,
    AsyncTasksSpec,
    DeploymentSpec,
    LifecycleSpec,
    ModelSpec,
    PolicyDocument,
    PriorityClassSpec,
    RateLimitSpec,
    RecordsSpec,
    SlaClassSpec,
    TenantSpec,
    UseCaseSpec,
)
from governance.policy_as_code.selectors import policy_current
from governance.prices import amount_text, moment_text

HEADER = (
    "# Switchyard governance policy (policy as code, format 1).\n"
    "# Check with `manage.py policy plan FILE`; apply with `manage.py policy apply FILE`.\n"
    "# Keys are listed by name only: their secrets are never written to a file.\n"
)
# Rows of the matrix from the most to the least important environment.
_ENVIRONMENTS = [Environment.PROD, Environment.UAT, Environment.TEST, Environment.DEV]
_SCOPES = list(RateLimitScope.values)


class _Flow(dict[str, Any]):
    """A mapping written on one line: ``{guardrail: pii, side: request, action: redact}``."""


class _FlowList(list[Any]):
    """A list written on one line: ``[chat, completions]``."""


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # anchors and aliases make a file harder to read and review

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        # Indent list items under their key, as people (and most linters) write YAML.
        super().increase_indent(flow, False)


def _represent_flow(dumper: _Dumper, data: _Flow) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=True)


def _represent_flow_list(dumper: _Dumper, data: _FlowList) -> yaml.Node:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)


def _represent_str(dumper: _Dumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(_Flow, _represent_flow)
_Dumper.add_representer(_FlowList, _represent_flow_list)
_Dumper.add_representer(str, _represent_str)


def _some(**fields: Any) -> dict[str, Any]:
    """The fields that say something: no empty strings, empty lists or nulls."""
    return {name: value for name, value in fields.items() if value not in ("", [], (), None)}


def _deployment(spec: DeploymentSpec) -> dict[str, Any]:
    return {
        "served_name": spec.served_name,
        **_some(version=spec.version),
        "replicas": sorted(spec.replicas),
        **_some(node_pool=spec.node_pool, lora_adapters=_FlowList(sorted(spec.lora_adapters))),
        "max_in_flight_per_replica": spec.max_in_flight_per_replica,
        **({} if spec.active else {"active": False}),
    }


def _model(spec: ModelSpec) -> dict[str, Any]:
    return {
        "id": spec.id,
        **_some(description=spec.description),
        "capabilities": _FlowList(sorted(spec.capabilities)),
        "timeout_seconds": float(spec.timeout_seconds),
        **_some(max_tokens=spec.max_tokens),
        **_some(
            deployments=[
                _deployment(d) for d in sorted(spec.deployments, key=lambda d: d.served_name)
            ]
        ),
        # Amounts as quoted decimal strings, so that no reader takes them for floats.
        **_some(
            prices=[
                _Flow(
                    {
                        "from": moment_text(p.effective_from),
                        "input_per_mtok": amount_text(p.input_per_mtok),
                        "output_per_mtok": amount_text(p.output_per_mtok),
                    }
                )
                for p in sorted(spec.prices or (), key=lambda p: p.effective_from)
            ]
        ),
        **_some(lifecycle=_lifecycle(spec.lifecycle)),
        **_some(routing=_routing(spec.routing)),
    }


def _routing(routing: Mapping[str, Any]) -> dict[str, Any] | None:
    """``split``, ``sticky`` and ``aliases`` as they are set; nothing for a model without."""
    if not routing:
        return None
    return {
        **({"split": _Flow(sorted(routing["split"].items()))} if routing.get("split") else {}),
        **({"sticky": routing["sticky"]} if routing.get("sticky", "request") != "request" else {}),
        **(
            {"aliases": _Flow(sorted(routing["aliases"].items()))} if routing.get("aliases") else {}
        ),
    } or None


def _lifecycle(spec: LifecycleSpec) -> dict[str, Any] | None:
    """Only what differs from an active model's, and nothing for an active one."""
    if spec == LifecycleSpec():
        return None
    return {
        "status": spec.status,
        **_some(
            sunset_at=moment_text(spec.sunset_at) if spec.sunset_at else None,
            successor=spec.successor,
            notice_url=spec.notice_url,
        ),
        "at_sunset": spec.at_sunset,
    }


def _tenant(spec: TenantSpec) -> dict[str, Any]:
    return {
        "id": spec.id,
        "name": spec.name,
        "business_unit": spec.business_unit,
        "application_id": spec.application_id,
        "environment": spec.environment,
        "owner_email": spec.owner_email,
        **_some(contacts=sorted(spec.contacts)),
        **_hold(spec),
    }


def _hold(spec: TenantSpec | UseCaseSpec) -> dict[str, Any]:
    """A hold that is on, with the reason it was placed for; none says nothing (and a file
    that says nothing leaves a hold as it is)."""
    if not spec.legal_hold:
        return {}
    return {
        "legal_hold": True,
        "legal_hold_reason": spec.legal_hold_reason or "(no reason recorded)",
    }


def _records(spec: RecordsSpec) -> dict[str, Any]:
    """The record settings that differ from the defaults (metadata, 90 days, no developers)."""
    default = RecordsSpec()
    return _Flow(
        {
            name: value
            for name, value in (
                ("policy", spec.policy),
                ("retention_days", spec.retention_days),
                ("developers_can_read", spec.developers_can_read),
            )
            if value != getattr(default, name)
        }
    )


def _async_tasks(spec: AsyncTasksSpec) -> dict[str, Any]:
    """The async task settings that differ from the defaults (600 s, no cache)."""
    default = AsyncTasksSpec()
    return _Flow(
        {
            name: getattr(spec, name)
            for name in ("result_ttl_seconds", "cache_seconds")
            if getattr(spec, name) != getattr(default, name)
        }
    )


def _sla_class(spec: SlaClassSpec) -> dict[str, Any]:
    """One SLA class; the fields at their defaults are left out, as the file may."""
    default = SlaClassSpec(name="", priority_class="", kinds=())
    return {
        "name": spec.name,
        **_some(description=spec.description),
        **(
            {"turnaround_seconds": spec.turnaround_seconds}
            if spec.turnaround_seconds is not None
            else {}
        ),
        **(
            {
                "windows": [
                    _Flow(days=_FlowList(w["days"]), start=w["start"], end=w["end"])
                    for w in spec.windows
                ]
            }
            if spec.windows
            else {}
        ),
        **({"time_zone": spec.time_zone} if spec.time_zone != default.time_zone else {}),
        "priority_class": spec.priority_class,
        **(
            {"max_file_bytes": spec.max_file_bytes}
            if spec.max_file_bytes != default.max_file_bytes
            else {}
        ),
        "kinds": _FlowList(spec.kinds),
    }


def _use_case(spec: UseCaseSpec) -> dict[str, Any]:
    sla_classes = sorted(spec.sla_classes, key=lambda c: c.name)
    limits = _Flow(_some(**{name: getattr(spec.limits, name) for name in USE_CASE_LIMIT_FIELDS}))
    guardrails = [
        _Flow(
            guardrail=g.guardrail,
            side=g.side,
            action=g.action,
            **({"config": _Flow(g.config)} if g.config else {}),
        )
        for g in sorted(spec.guardrails, key=lambda g: g.position)  # the order they run
    ]
    return {
        "id": spec.id,
        "name": spec.name,
        "kind": spec.kind,
        "status": spec.status,
        **_some(status_reason=spec.status_reason),
        "namespace": spec.namespace,
        "data_classification": spec.data_classification,
        **_some(ticket_ref=spec.ticket_ref),
        **_some(service_account_client_id=spec.service_account_client_id),
        "purpose": spec.purpose,
        "models": _FlowList(sorted(spec.models)),
        **({"model_pins": _Flow(sorted(spec.model_pins.items()))} if spec.model_pins else {}),
        **_some(model_fallbacks=_fallbacks(spec.model_fallbacks)),
        **({"limits": limits} if limits else {}),
        **_some(guardrails=guardrails),
        # Only when it is not the default (fail closed), as the file may leave it out.
        **_some(
            guardrail_failure=spec.guardrail_failure if spec.guardrail_failure != "closed" else ""
        ),
        **({"records": records} if (records := _records(spec.records)) else {}),
        **({"async_tasks": tasks} if (tasks := _async_tasks(spec.async_tasks)) else {}),
        **_some(sla_classes=[_sla_class(c) for c in sla_classes]),
        **_hold(spec),
    }


def _fallbacks(chains: Mapping[str, tuple[str, ...]]) -> _Flow | None:
    """``{llama-70b: [llama-8b]}``: each chain in its order (the order they serve in)."""
    return _Flow((model, list(chains[model])) for model in sorted(chains)) if chains else None


def _priority_class(spec: PriorityClassSpec) -> _Flow:
    degrade = spec.degrade_after_seconds
    return _Flow(
        name=spec.name,
        rank=spec.rank,
        vllm_priority=spec.vllm_priority,
        queue_timeout_seconds=float(spec.queue_timeout_seconds),
        max_queue_length=spec.max_queue_length,
        max_pool_share=float(spec.max_pool_share),
        # Left out when empty: the class degrades only when its model refuses it.
        **_some(degrade_after_seconds=None if degrade is None else float(degrade)),
    )


def _matrix(matrix: dict[str, dict[str, str]]) -> dict[str, _Flow]:
    rows = sorted(matrix, key=lambda e: _ENVIRONMENTS.index(Environment(e)))
    return {
        environment: _Flow(
            {
                namespace: matrix[environment][namespace]
                for namespace in Namespace.values
                if namespace in matrix[environment]
            }
        )
        for environment in rows
    }


def _rate_limit(spec: RateLimitSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "scope": spec.scope,
        **_some(
            model=spec.model,
            tenant=spec.tenant,
            requests_per_minute=spec.requests_per_minute,
            tokens_per_minute=spec.tokens_per_minute,
            tokens_per_day=spec.tokens_per_day,
        ),
    }


def policy_data(document: PolicyDocument) -> dict[str, Any]:
    """The document as the plain data a policy file holds, sections in the file's order."""
    data: dict[str, Any] = {"version": FORMAT_VERSION}
    if document.models is not None:
        data["models"] = [_model(m) for m in sorted(document.models, key=lambda m: m.id)]
    if document.tenants is not None:
        data["tenants"] = [_tenant(t) for t in sorted(document.tenants, key=lambda t: t.id)]
    if document.use_cases is not None:
        data["use_cases"] = [
            _use_case(u) for u in sorted(document.use_cases, key=lambda u: (u.tenant, u.slug))
        ]
    if document.priority_classes is not None:
        data["priority_classes"] = [
            _priority_class(c) for c in sorted(document.priority_classes, key=lambda c: c.rank)
        ]
    if document.priority_matrix is not None:
        data["priority_matrix"] = _matrix(document.priority_matrix)
    if document.rate_limits is not None:
        data["rate_limits"] = [
            _rate_limit(p)
            for p in sorted(document.rate_limits, key=lambda p: (_SCOPES.index(p.scope), p.name))
        ]
    if document.keys is not None:
        data["keys"] = [
            _Flow(use_case=k.use_case, name=k.name)
            for k in sorted(document.keys, key=lambda k: (k.use_case, k.name))
        ]
    return data


def policy_dump(document: PolicyDocument) -> str:
    body = yaml.dump(
        policy_data(document),
        Dumper=_Dumper,
        sort_keys=False,  # the order above is the order people read
        allow_unicode=True,
        width=100,
        default_flow_style=False,
    )
    return HEADER + _spaced(body)


def _spaced(body: str) -> str:
    """A blank line before each section and each multi-line record, for the eye."""
    lines: list[str] = []
    for line in body.splitlines():
        section = not line.startswith((" ", "version:"))
        record = line.startswith("  - ") and not line.startswith("  - {")
        after_heading = bool(lines) and not lines[-1].startswith(" ")
        if section or (record and not after_heading):
            lines.append("")
        lines.append(line)
    return "\n".join(lines) + "\n"


def policy_export() -> str:
    """The database's governance records as a policy file."""
    return policy_dump(policy_current())
