"""The policy file's format: typed records parsed from YAML, every problem reported with its path.

Parsing never stops at the first problem: a platform engineer fixing a file in CI wants the
whole list at once. Checks that need only the file live here (types, enums, URLs, duplicate
ids, references between sections the file defines); references into sections the file leaves
out are resolved against the database by ``plan``, with the same function.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, TypeVar

import yaml
from django.core.exceptions import ValidationError

from governance import model_routing
from governance.choices import (
    SLA_CLASS_FIELDS,
    SLA_MIN_TURNAROUND_SECONDS,
    AtSunset,
    Capability,
    DataClassification,
    Environment,
    FileKind,
    GuardrailAction,
    GuardrailFailure,
    GuardrailSide,
    ModelStatus,
    Namespace,
    RateLimitScope,
    RecordPolicy,
    UseCaseKind,
    UseCaseStatus,
)
from governance.models import MAX_FALLBACKS
from governance.policy_as_code.errors import PolicyInvalid, Problem
from governance.policy_as_code.fields import (
    Reader,
    check_application_id,
    check_client_id,
    check_email,
    check_model_id,
    check_replica_url,
    check_slug,
    check_url,
    is_json,
)
from governance.prices import Price, PriceError, price_amount, price_moment, prices_problems
from governance.sla_windows import WindowError, parse_windows, zone
from guardrails.base import SettingsError
from guardrails.catalogue import entries as catalogue_entries
from guardrails.catalogue import validate_selection

FORMAT_VERSION: Final = 1
SECTIONS: Final = (
    "models",
    "tenants",
    "use_cases",
    "priority_classes",
    "priority_matrix",
    "rate_limits",
    "keys",
)
LIMIT_FIELDS: Final = ("requests_per_minute", "tokens_per_minute", "tokens_per_day")
USE_CASE_LIMIT_FIELDS: Final = (*LIMIT_FIELDS, "max_concurrent")
_SMALLINT_MAX: Final = 32767  # PositiveSmallIntegerField

T = TypeVar("T")


# --- the records -------------------------------------------------------------------------
@dataclass(frozen=True)
class DeploymentSpec:
    served_name: str
    replicas: tuple[str, ...]
    node_pool: str = ""
    version: str = ""  # the model version it serves (docs/models.md); "" for none
    lora_adapters: tuple[str, ...] = ()
    max_in_flight_per_replica: int = 64
    active: bool = True


@dataclass(frozen=True)
class LifecycleSpec:
    """A model's ``lifecycle:`` (docs/models.md); the default is an active model's."""

    status: str = ModelStatus.ACTIVE.value
    sunset_at: datetime | None = None
    successor: str | None = None
    notice_url: str = ""
    at_sunset: str = AtSunset.REFUSE.value


@dataclass(frozen=True)
class ModelSpec:
    id: str
    capabilities: tuple[str, ...]
    description: str = ""
    timeout_seconds: float = 60.0
    max_tokens: int | None = None
    deployments: tuple[DeploymentSpec, ...] = ()
    # The model's price history (``prices:``); None where the file says nothing about prices,
    # which leaves the stored ones as they are.
    prices: tuple[Price, ...] | None = None
    lifecycle: LifecycleSpec = LifecycleSpec()
    # Which version answers: ``{split, sticky, aliases}`` in the canonical form
    # ``governance.model_routing.clean_routing`` gives it; {} for none.
    routing: Mapping[str, Any] = field(default_factory=dict)

    def versions(self) -> set[str]:
        """The version labels of the model's active deployments in the file."""
        return {d.version for d in self.deployments if d.active and d.version}


@dataclass(frozen=True)
class TenantSpec:
    id: str
    name: str
    business_unit: str
    application_id: str
    environment: str
    owner_email: str
    contacts: tuple[str, ...] = ()
    # True or False as the file says; None where the file says nothing (the hold is left as
    # it is: an old file must not lift a hold by leaving it out). The reason is recorded
    # when apply moves the hold, and not compared afterwards (the audit trail keeps it).
    legal_hold: bool | None = None
    legal_hold_reason: str = ""


@dataclass(frozen=True)
class RecordsSpec:
    """What the gateway keeps of a use case's requests (``records:`` in the file)."""

    policy: str = RecordPolicy.METADATA.value
    retention_days: int = 90
    developers_can_read: bool = False


@dataclass(frozen=True)
class AsyncTasksSpec:
    """How long a use case's async results stay readable and its result cache, in seconds
    (``async_tasks:`` in the file; docs/async.md)."""

    result_ttl_seconds: int = 600
    cache_seconds: int = 0


@dataclass(frozen=True)
class LimitsSpec:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    max_concurrent: int | None = None


@dataclass(frozen=True)
class GuardrailSpec:
    guardrail: str
    side: str
    action: str
    config: dict[str, Any] = field(default_factory=dict)
    #: the order it runs in: its place in the use case's list
    position: int = 0


@dataclass(frozen=True)
class SlaClassSpec:
    """One of a use case's SLA classes (``sla_classes:`` under the use case; docs/files.md)."""

    name: str
    priority_class: str
    kinds: tuple[str, ...]
    description: str = ""
    turnaround_seconds: int | None = None
    # as the file writes them: [{"days": [...], "start": "HH:MM", "end": "HH:MM"}]
    windows: tuple[dict[str, Any], ...] = ()
    time_zone: str = "UTC"
    max_file_bytes: int = 512 * 1024 * 1024


@dataclass(frozen=True)
class UseCaseSpec:
    tenant: str
    slug: str
    name: str
    kind: str
    purpose: str
    status: str
    data_classification: str = DataClassification.INTERNAL.value
    namespace: str = Namespace.DEV.value
    ticket_ref: str = ""
    # The Keycloak client whose service-account tokens act as this use case; "" for none.
    service_account_client_id: str = ""
    # The reason given to the lifecycle transition that reaches ``status``; it is recorded when
    # apply moves the status and not compared afterwards (the database keeps the last one).
    status_reason: str = ""
    models: tuple[str, ...] = ()
    limits: LimitsSpec = LimitsSpec()
    guardrails: tuple[GuardrailSpec, ...] = ()
    guardrail_failure: str = GuardrailFailure.CLOSED.value
    records: RecordsSpec = RecordsSpec()
    async_tasks: AsyncTasksSpec = AsyncTasksSpec()
    sla_classes: tuple[SlaClassSpec, ...] = ()
    # {model id: version or alias} the use case always gets (``model_pins:``)
    model_pins: Mapping[str, str] = field(default_factory=dict)
    # {model id: the models that serve, in order, when it refuses} (``model_fallbacks:``)
    model_fallbacks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    legal_hold: bool | None = None  # as on TenantSpec
    legal_hold_reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.tenant}/{self.slug}"


@dataclass(frozen=True)
class PriorityClassSpec:
    name: str
    rank: int
    vllm_priority: int
    queue_timeout_seconds: float = 30.0
    max_queue_length: int = 1000
    max_pool_share: float = 1.0
    # How long a request of the class waits on a saturated model before its fallback serves
    # it; None (left out of the file): only when the model refuses it.
    degrade_after_seconds: float | None = None


@dataclass(frozen=True)
class RateLimitSpec:
    name: str
    scope: str
    model: str | None = None
    tenant: str | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None


@dataclass(frozen=True)
class KeySpec:
    use_case: str  # tenant/slug
    name: str


@dataclass(frozen=True)
class PolicyDocument:
    """A whole policy. A section that is None is not managed: the file leaves it out."""

    models: tuple[ModelSpec, ...] | None = None
    tenants: tuple[TenantSpec, ...] | None = None
    use_cases: tuple[UseCaseSpec, ...] | None = None
    priority_classes: tuple[PriorityClassSpec, ...] | None = None
    # environment → namespace → priority class name
    priority_matrix: dict[str, dict[str, str]] | None = None
    rate_limits: tuple[RateLimitSpec, ...] | None = None
    keys: tuple[KeySpec, ...] | None = None


# --- sections ------------------------------------------------------------------------------
def _records(
    raw: Any, section: str, problems: list[Problem], id_key: str
) -> Iterator[tuple[str, Mapping[Any, Any]]]:
    """Yield (path, mapping) for each entry of a list section, keyed by its id where it has one."""
    if not isinstance(raw, list):
        problems.append(Problem(section, "must be a list"))
        return
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            problems.append(Problem(f"{section}[{index}]", "must be a mapping"))
            continue
        ident = item.get(id_key)
        label = ident if isinstance(ident, str) and ident else index
        yield f"{section}[{label}]", item


def _once(seen: dict[str, str], ident: str, path: str, problems: list[Problem]) -> None:
    if ident in seen:
        problems.append(Problem(path, f"is defined twice (also {seen[ident]})"))
    else:
        seen[ident] = path


def _deployments(raw: list[Any], path: str, problems: list[Problem]) -> tuple[DeploymentSpec, ...]:
    known = (
        "served_name",
        "replicas",
        "node_pool",
        "version",
        "lora_adapters",
        "max_in_flight_per_replica",
        "active",
    )
    deployments: list[DeploymentSpec] = []
    seen: dict[str, str] = {}
    for item_path, item in _records(raw, f"{path}.deployments", problems, "served_name"):
        r = Reader(item, item_path, problems, known)
        served_name = r.text("served_name", max_length=128, check=check_model_id)
        _once(seen, served_name, item_path, problems)
        deployments.append(
            DeploymentSpec(
                served_name=served_name,
                replicas=r.texts("replicas", required=True, check=check_replica_url),
                node_pool=r.text("node_pool", required=False, max_length=64),
                version=r.text("version", required=False, max_length=32, check=check_label),
                lora_adapters=r.texts("lora_adapters"),
                max_in_flight_per_replica=r.integer(
                    "max_in_flight_per_replica", default=64, minimum=1
                ),
                active=r.boolean("active", default=True),
            )
        )
    active = [d for d in deployments if d.active]
    if any(d.version for d in active) and not all(d.version for d in active):
        for d in active:
            if not d.version:
                problems.append(
                    Problem(
                        f"{path}.deployments[{d.served_name}].version",
                        "name a version on all of this model's active deployments or on none",
                    )
                )
    return tuple(deployments)


def check_label(value: str) -> str | None:
    """A version (or alias) label, as ``governance.model_routing`` has it."""
    if model_routing.LABEL.fullmatch(value) is None:
        return f"use {model_routing.LABEL_HELP}"
    return None


def _prices(raw: Any, path: str, problems: list[Problem]) -> tuple[Price, ...]:
    """``prices:`` as a list of ``{from, input_per_mtok, output_per_mtok}``; amounts in the
    company's currency per million tokens, ``from`` an ISO date and time with a time zone."""
    if not isinstance(raw, list):
        problems.append(Problem(f"{path}.prices", "must be a list"))
        return ()
    prices: list[Price] = []
    for index, item in enumerate(raw):
        item_path = f"{path}.prices[{index}]"
        if not isinstance(item, dict):
            problems.append(Problem(item_path, "must be a mapping"))
            continue
        Reader(item, item_path, problems, ("from", "input_per_mtok", "output_per_mtok"))
        values: dict[str, Any] = {}
        for name, read in (
            ("from", price_moment),
            ("input_per_mtok", price_amount),
            ("output_per_mtok", price_amount),
        ):
            if item.get(name) is None:
                problems.append(Problem(f"{item_path}.{name}", "is required"))
                continue
            try:
                values[name] = read(item[name])
            except PriceError as exc:
                problems.append(Problem(f"{item_path}.{name}", str(exc)))
        if len(values) == 3:
            prices.append(
                Price(
                    effective_from=values["from"],
                    input_per_mtok=values["input_per_mtok"],
                    output_per_mtok=values["output_per_mtok"],
                )
            )
    problems.extend(Problem(f"{path}.prices", p) for p in prices_problems(prices))
    return tuple(sorted(prices, key=lambda p: p.effective_from))


def _models(raw: Any, problems: list[Problem]) -> tuple[ModelSpec, ...]:
    known = (
        "id",
        "description",
        "capabilities",
        "timeout_seconds",
        "max_tokens",
        "deployments",
        "prices",
        "lifecycle",
        "routing",
    )
    models: list[ModelSpec] = []
    seen: dict[str, str] = {}
    for path, item in _records(raw, "models", problems, "id"):
        r = Reader(item, path, problems, known)
        ident = r.text("id", max_length=128, check=check_model_id)
        _once(seen, ident, path, problems)
        deployments = _deployments(r.listing("deployments"), path, problems)
        models.append(
            ModelSpec(
                id=ident,
                description=r.text("description", required=False, max_length=300),
                capabilities=r.texts("capabilities", required=True, allowed=Capability.values),
                timeout_seconds=r.number(
                    "timeout_seconds", default=60.0, minimum=0.1, unit="seconds"
                ),
                max_tokens=r.optional_positive("max_tokens"),
                deployments=deployments,
                # ``prices: []`` (or a bare ``prices:``) manages none; no key leaves them.
                prices=(
                    _prices([] if item["prices"] is None else item["prices"], path, problems)
                    if "prices" in item
                    else None
                ),
                lifecycle=_lifecycle(r),
                routing=_routing(r, deployments),
            )
        )
    return tuple(models)


def _routing(model: Reader, deployments: tuple[DeploymentSpec, ...]) -> dict[str, Any]:
    """``routing: {split, sticky, aliases}`` checked against the versions of the model's
    active deployments in the file (the model's own rule, ``model_routing.clean_routing``)."""
    raw = model.mapping("routing")
    if raw is None:
        return {}
    versions = {d.version for d in deployments if d.active and d.version}
    try:
        return model_routing.clean_routing(raw, versions)
    except ValidationError as exc:
        for message in exc.messages:
            model.problem("routing", message)
    return {}


def _lifecycle(model: Reader) -> LifecycleSpec:
    """``lifecycle: {status, sunset_at, successor, notice_url, at_sunset}``; left out, active.
    The rules between the fields (a deprecated model needs a sunset and a successor) are the
    model's own, checked when the plan is applied, as for every other door."""
    raw = model.mapping("lifecycle")
    if raw is None:
        return LifecycleSpec()
    known = ("status", "sunset_at", "successor", "notice_url", "at_sunset")
    r = Reader(raw, model.at("lifecycle"), model.problems, known)
    sunset_at = None
    if raw.get("sunset_at") is not None:
        try:
            sunset_at = price_moment(raw["sunset_at"])  # the same rule: a moment with a zone
        except PriceError as exc:
            r.problem("sunset_at", str(exc))
    successor = r.text("successor", required=False, max_length=128, check=check_model_id)
    return LifecycleSpec(
        status=r.choice("status", ModelStatus.values, default=ModelStatus.ACTIVE.value),
        sunset_at=sunset_at,
        successor=successor or None,
        notice_url=r.text("notice_url", required=False, max_length=200, check=check_url),
        at_sunset=r.choice("at_sunset", AtSunset.values, default=AtSunset.REFUSE.value),
    )


def _tenants(raw: Any, problems: list[Problem]) -> tuple[TenantSpec, ...]:
    known = (
        "id",
        "name",
        "business_unit",
        "application_id",
        "environment",
        "owner_email",
        "contacts",
        "legal_hold",
        "legal_hold_reason",
    )
    tenants: list[TenantSpec] = []
    seen: dict[str, str] = {}
    for path, item in _records(raw, "tenants", problems, "id"):
        r = Reader(item, path, problems, known)
        ident = r.text("id", max_length=63, check=check_slug)
        _once(seen, ident, path, problems)
        tenants.append(
            TenantSpec(
                id=ident,
                name=r.text("name"),
                business_unit=r.text("business_unit"),
                application_id=r.text("application_id", max_length=24, check=check_application_id),
                environment=r.choice("environment", Environment.values),
                owner_email=r.text("owner_email", max_length=254, check=check_email),
                contacts=r.texts("contacts", check=check_email),
                **_legal_hold(r),
            )
        )
    return tuple(tenants)


def _legal_hold(r: Reader) -> dict[str, Any]:
    """``legal_hold`` (true/false; absent: left as it is) and the reason for placing it."""
    hold = None if r.raw.get("legal_hold") is None else r.boolean("legal_hold", default=False)
    reason = r.text("legal_hold_reason", required=False, max_length=2000)
    if hold is True and not reason.strip():
        r.problem("legal_hold_reason", "is required with legal_hold: true (say why)")
    if hold is None and reason:
        r.problem("legal_hold_reason", "goes with legal_hold: true or false")
    return {"legal_hold": hold, "legal_hold_reason": reason}


RETENTION_DAYS_MAX: Final = 36_500  # governance.services.record_bounds.RETENTION_DAYS_MAX


def _records_settings(
    raw: Mapping[Any, Any] | None, path: str, problems: list[Problem]
) -> RecordsSpec:
    if raw is None:
        return RecordsSpec()
    r = Reader(
        raw, f"{path}.records", problems, ("policy", "retention_days", "developers_can_read")
    )
    return RecordsSpec(
        policy=r.choice("policy", RecordPolicy.values, default=RecordPolicy.METADATA.value),
        retention_days=r.integer(
            "retention_days", default=90, minimum=1, maximum=RETENTION_DAYS_MAX
        ),
        developers_can_read=r.boolean("developers_can_read", default=False),
    )


def _async_tasks_settings(
    raw: Mapping[Any, Any] | None, path: str, problems: list[Problem]
) -> AsyncTasksSpec:
    if raw is None:
        return AsyncTasksSpec()
    r = Reader(raw, f"{path}.async_tasks", problems, ("result_ttl_seconds", "cache_seconds"))
    return AsyncTasksSpec(
        result_ttl_seconds=r.integer("result_ttl_seconds", default=600, minimum=10, maximum=86_400),
        cache_seconds=r.integer("cache_seconds", default=0, minimum=0, maximum=86_400),
    )


def split_use_case_id(value: str) -> tuple[str, str] | None:
    tenant, sep, slug = value.partition("/")
    if not sep or check_slug(tenant) is not None or check_slug(slug) is not None:
        return None
    return tenant, slug


def _guardrail_settings(
    r: Reader, guardrail: str, side: str, action: str, config: Mapping[Any, Any]
) -> dict[str, Any]:
    """The settings as the detector completes them, so that the file and the database (which
    stores complete settings) compare equal; a bad setting is a problem at ``config``."""
    if not (guardrail and side and action):
        return dict(config)
    entry = catalogue_entries()[guardrail]
    stages = {"request", "response"} if side == GuardrailSide.BOTH else {side}
    if not stages <= set(entry.stages):
        r.problem("side", f"{guardrail} runs on {' and '.join(sorted(entry.stages))} only")
        return dict(config)
    if action == GuardrailAction.REDACT and not entry.redacts:
        r.problem("action", f"{guardrail} cannot redact; choose block or flag")
        return dict(config)
    try:
        return validate_selection(guardrail, side, action, dict(config))
    except SettingsError as exc:
        r.problem("config", str(exc))
    except (ImportError, AttributeError) as exc:
        r.problem("guardrail", f"cannot be loaded on this server ({exc})")
    return dict(config)


def _guardrails(raw: list[Any], path: str, problems: list[Problem]) -> tuple[GuardrailSpec, ...]:
    """A use case's guardrails in the order they run (their order in the file)."""
    guardrails: list[GuardrailSpec] = []
    seen: dict[str, str] = {}
    stages_of: dict[str, set[str]] = {}
    if not isinstance(raw, list):
        return ()
    for index, item in enumerate(raw):
        item_path = f"{path}.guardrails[{index}]"
        if not isinstance(item, dict):
            problems.append(Problem(item_path, "must be a mapping"))
            continue
        if isinstance(item.get("side"), str) and isinstance(item.get("guardrail"), str):
            item_path = f"{path}.guardrails[{item['side']}:{item['guardrail']}]"
        r = Reader(item, item_path, problems, ("guardrail", "side", "action", "config"))
        guardrail = r.choice("guardrail", sorted(catalogue_entries()))
        side = r.choice("side", GuardrailSide.values)
        action = r.choice("action", GuardrailAction.values)
        stages = {"request", "response"} if side == GuardrailSide.BOTH else {side}
        if f"{side}:{guardrail}" not in seen and stages_of.get(guardrail, set()) & stages:
            r.problem("side", f"{guardrail} is already selected on one of these stages")
        _once(seen, f"{side}:{guardrail}", item_path, problems)
        stages_of.setdefault(guardrail, set()).update(stages)
        config = r.mapping("config") or {}
        if not is_json(config):
            r.problem("config", "must hold only JSON values (strings, numbers, lists, mappings)")
        guardrails.append(
            GuardrailSpec(
                guardrail=guardrail,
                side=side,
                action=action,
                config=_guardrail_settings(r, guardrail, side, action, config),
                position=index,
            )
        )
    return tuple(guardrails)


SLA_TURNAROUND_MIN: Final = SLA_MIN_TURNAROUND_SECONDS
SLA_FIELDS: Final = SLA_CLASS_FIELDS


def _sla_windows(r: Reader) -> tuple[tuple[dict[str, Any], ...], bool]:
    """The windows as written, and whether they parse (``governance.sla_windows``'s words)."""
    raw = r.raw.get("windows")
    try:
        parse_windows(raw)
    except WindowError as exc:
        r.problem("windows", str(exc))
        return (), False
    return tuple(dict(w) for w in raw or ()), True


def _sla_classes(raw: list[Any], path: str, problems: list[Problem]) -> tuple[SlaClassSpec, ...]:
    """The same rules as ``governance.sla_classes.sla_class_validate``, with file paths."""
    classes: list[SlaClassSpec] = []
    seen: dict[str, str] = {}
    for item_path, item in _records(raw, f"{path}.sla_classes", problems, "name"):
        r = Reader(item, item_path, problems, SLA_FIELDS)
        name = r.text("name", max_length=63, check=check_slug)
        _once(seen, name, item_path, problems)
        windows, windows_ok = _sla_windows(r)
        time_zone = r.text("time_zone", required=False, max_length=64) or "UTC"
        try:
            zone(time_zone)
        except WindowError as exc:
            r.problem("time_zone", str(exc))
        turnaround = None
        if item.get("turnaround_seconds") is not None:
            turnaround = r.integer(
                "turnaround_seconds", default=None, minimum=SLA_TURNAROUND_MIN, maximum=2**31 - 1
            )
        elif windows_ok and not windows:
            r.problem(
                "turnaround_seconds",
                "is required without windows (no turnaround means: by the end of the next window)",
            )
        classes.append(
            SlaClassSpec(
                name=name,
                description=r.text("description", required=False, max_length=300),
                turnaround_seconds=turnaround,
                windows=windows,
                time_zone=time_zone,
                priority_class=r.text("priority_class", max_length=32),
                max_file_bytes=r.integer(
                    "max_file_bytes", default=512 * 1024 * 1024, minimum=1, maximum=2**63 - 1
                ),
                kinds=r.texts("kinds", required=True, allowed=FileKind.values),
            )
        )
    return tuple(classes)


def _limits(raw: Mapping[Any, Any] | None, path: str, problems: list[Problem]) -> LimitsSpec:
    if raw is None:
        return LimitsSpec()
    r = Reader(raw, f"{path}.limits", problems, USE_CASE_LIMIT_FIELDS)
    return LimitsSpec(**{name: r.optional_positive(name) for name in USE_CASE_LIMIT_FIELDS})


def _use_cases(raw: Any, problems: list[Problem]) -> tuple[UseCaseSpec, ...]:
    known = (
        "id",
        "name",
        "kind",
        "purpose",
        "status",
        "status_reason",
        "data_classification",
        "namespace",
        "ticket_ref",
        "service_account_client_id",
        "models",
        "model_pins",
        "model_fallbacks",
        "limits",
        "guardrails",
        "guardrail_failure",
        "records",
        "async_tasks",
        "legal_hold",
        "legal_hold_reason",
        "sla_classes",
    )
    use_cases: list[UseCaseSpec] = []
    seen: dict[str, str] = {}
    clients: dict[str, str] = {}  # client id → the path of the use case bound to it
    for path, item in _records(raw, "use_cases", problems, "id"):
        r = Reader(item, path, problems, known)
        ident = r.text("id", max_length=127)
        parts = split_use_case_id(ident) if ident else None
        if ident and parts is None:
            r.problem("id", "must be tenant/slug, both in lowercase letters, digits and hyphens")
        _once(seen, ident, path, problems)
        tenant, slug = parts or ("", "")
        client = r.text(
            "service_account_client_id", required=False, max_length=255, check=check_client_id
        )
        if client in clients:
            r.problem(
                "service_account_client_id",
                f"client {client!r} is already bound to {clients[client]}; a client acts as "
                "one use case only",
            )
        elif client:
            clients[client] = path
        models = r.texts("models", check=check_model_id)
        use_cases.append(
            UseCaseSpec(
                tenant=tenant,
                slug=slug,
                name=r.text("name"),
                kind=r.choice("kind", UseCaseKind.values),
                purpose=r.text("purpose", max_length=10_000),
                status=r.choice("status", UseCaseStatus.values),
                status_reason=r.text("status_reason", required=False, max_length=2000),
                data_classification=r.choice(
                    "data_classification",
                    DataClassification.values,
                    default=DataClassification.INTERNAL.value,
                ),
                namespace=r.choice("namespace", Namespace.values, default=Namespace.DEV.value),
                ticket_ref=r.text("ticket_ref", required=False, max_length=64),
                service_account_client_id=client,
                models=models,
                model_pins=_model_pins(r),
                model_fallbacks=_model_fallbacks(r, models),
                limits=_limits(r.mapping("limits"), path, problems),
                guardrails=_guardrails(r.listing("guardrails"), path, problems),
                guardrail_failure=r.choice(
                    "guardrail_failure",
                    GuardrailFailure.values,
                    default=GuardrailFailure.CLOSED.value,
                ),
                records=_records_settings(r.mapping("records"), path, problems),
                async_tasks=_async_tasks_settings(r.mapping("async_tasks"), path, problems),
                sla_classes=_sla_classes(r.listing("sla_classes"), path, problems),
                **_legal_hold(r),
            )
        )
    return tuple(use_cases)


def _model_pins(use_case: Reader) -> dict[str, str]:
    """``model_pins: {model: version or alias}``; whether each names one of the model's is a
    reference, checked by ``reference_problems``."""
    raw = use_case.mapping("model_pins") or {}
    pins: dict[str, str] = {}
    for model, target in raw.items():
        where = f"model_pins.{model}"
        if not isinstance(model, str) or (problem := check_model_id(model)) is not None:
            use_case.problem(where, problem or "must be a model id")
        elif not isinstance(target, str) or (problem := check_label(target)) is not None:
            use_case.problem(where, f"must name a version or an alias: {problem or 'a string'}")
        else:
            pins[model] = target
    return {model: pins[model] for model in sorted(pins)}


def _model_fallbacks(use_case: Reader, models: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """``model_fallbacks: {model: [fallback, ...]}``: the use case's rule (``UseCase.clean``)
    against its ``models:`` in the file, so that a chain never names a model it may not call."""
    raw = use_case.mapping("model_fallbacks") or {}
    chains: dict[str, tuple[str, ...]] = {}
    for model, chain in raw.items():
        where = f"model_fallbacks.{model}"
        if not isinstance(model, str) or (problem := check_model_id(model)) is not None:
            use_case.problem(where, problem or "must be a model id")
        elif not isinstance(chain, list) or not all(isinstance(name, str) for name in chain):
            use_case.problem(where, "must list the models that serve in its place, in order")
        elif (problem := _fallback_problem(model, chain, models)) is not None:
            use_case.problem(where, problem)
        else:
            chains[model] = tuple(chain)
    return {model: chains[model] for model in sorted(chains)}


def _fallback_problem(model: str, chain: list[str], models: tuple[str, ...]) -> str | None:
    outside = [name for name in (model, *chain) if name not in models]
    if outside:
        listed = ", ".join(models) or "none"
        return f"{outside[0]!r} is not one of the use case's models ({listed})"
    if model in chain:
        return f"{model!r} cannot fall back to itself"
    if len(set(chain)) != len(chain):
        return "a fallback is listed twice"
    if not 1 <= len(chain) <= MAX_FALLBACKS:
        return f"give 1 to {MAX_FALLBACKS} fallbacks"
    return None


def _priority_classes(raw: Any, problems: list[Problem]) -> tuple[PriorityClassSpec, ...]:
    known = (
        "name",
        "rank",
        "vllm_priority",
        "queue_timeout_seconds",
        "max_queue_length",
        "max_pool_share",
        "degrade_after_seconds",
    )
    classes: list[PriorityClassSpec] = []
    seen: dict[str, str] = {}
    ranks: dict[int, str] = {}
    for path, item in _records(raw, "priority_classes", problems, "name"):
        r = Reader(item, path, problems, known)
        name = r.text("name", max_length=32, check=check_slug)
        _once(seen, name, path, problems)
        rank = r.integer("rank", default=None, minimum=0, maximum=_SMALLINT_MAX)
        if rank in ranks and isinstance(item.get("rank"), int):
            r.problem("rank", f"rank {rank} is also given to {ranks[rank]}")
        ranks.setdefault(rank, path)
        classes.append(
            PriorityClassSpec(
                name=name,
                rank=rank,
                vllm_priority=r.integer(
                    "vllm_priority", default=None, minimum=-(2**31), maximum=2**31 - 1
                ),
                queue_timeout_seconds=r.number(
                    "queue_timeout_seconds", default=30.0, minimum=0.0, unit="seconds"
                ),
                max_queue_length=r.integer("max_queue_length", default=1000, minimum=0),
                max_pool_share=r.number(
                    "max_pool_share", default=1.0, minimum=0.001, maximum=1.0, unit="fraction"
                ),
                # Left out (or null): only when the model refuses the request.
                degrade_after_seconds=(
                    None
                    if item.get("degrade_after_seconds") is None
                    else r.number("degrade_after_seconds", default=0.0, minimum=0.0, unit="seconds")
                ),
            )
        )
    return tuple(classes)


def _priority_matrix(raw: Any, problems: list[Problem]) -> dict[str, dict[str, str]]:
    if not isinstance(raw, dict):
        problems.append(
            Problem("priority_matrix", "must map environment → namespace → priority class")
        )
        return {}
    matrix: dict[str, dict[str, str]] = {}
    for environment, row in raw.items():
        path = f"priority_matrix.{environment}"
        if environment not in Environment.values:
            problems.append(
                Problem(path, f"unknown environment; use {', '.join(Environment.values)}")
            )
            continue
        if not isinstance(row, dict):
            problems.append(Problem(path, "must map namespace → priority class"))
            continue
        cells: dict[str, str] = {}
        for namespace, class_name in row.items():
            if namespace not in Namespace.values:
                problems.append(
                    Problem(
                        f"{path}.{namespace}",
                        f"unknown namespace; use {', '.join(Namespace.values)}",
                    )
                )
            elif not isinstance(class_name, str) or not class_name:
                problems.append(Problem(f"{path}.{namespace}", "must name a priority class"))
            else:
                cells[str(namespace)] = class_name
        matrix[str(environment)] = cells
    return matrix


def _rate_limits(raw: Any, problems: list[Problem]) -> tuple[RateLimitSpec, ...]:
    known = ("name", "scope", "model", "tenant", *LIMIT_FIELDS)
    policies: list[RateLimitSpec] = []
    seen: dict[str, str] = {}
    for path, item in _records(raw, "rate_limits", problems, "name"):
        r = Reader(item, path, problems, known)
        name = r.text("name", max_length=100)
        _once(seen, name, path, problems)
        scope = r.choice("scope", RateLimitScope.values)
        needs_model = scope in (RateLimitScope.MODEL, RateLimitScope.TENANT_MODEL)
        needs_tenant = scope in (RateLimitScope.TENANT, RateLimitScope.TENANT_MODEL)
        model = r.text("model", required=needs_model, max_length=128) or None
        tenant = r.text("tenant", required=needs_tenant, max_length=63) or None
        if scope and model is not None and not needs_model:
            r.problem("model", f"a {scope} limit does not name a model")
        if scope and tenant is not None and not needs_tenant:
            r.problem("tenant", f"a {scope} limit does not name a tenant")
        limits = {name: r.optional_positive(name) for name in LIMIT_FIELDS}
        if all(item.get(name) is None for name in LIMIT_FIELDS):
            r.problem("", f"set at least one of {', '.join(LIMIT_FIELDS)}")
        policies.append(RateLimitSpec(name=name, scope=scope, model=model, tenant=tenant, **limits))
    return tuple(policies)


def _keys(raw: Any, problems: list[Problem]) -> tuple[KeySpec, ...]:
    keys: list[KeySpec] = []
    seen: dict[str, str] = {}
    if not isinstance(raw, list):
        problems.append(Problem("keys", "must be a list"))
        return ()
    for index, item in enumerate(raw):
        path = f"keys[{index}]"
        if not isinstance(item, dict):
            problems.append(Problem(path, "must be a mapping"))
            continue
        forbidden = {"key", "plaintext", "secret", "hash", "key_hash", "value"} & set(item)
        if forbidden:
            problems.append(
                Problem(path, "keys are never written in the file; give use_case and name only")
            )
            continue
        r = Reader(item, path, problems, ("use_case", "name"))
        use_case = r.text("use_case", max_length=127)
        if use_case and split_use_case_id(use_case) is None:
            r.problem("use_case", "must be tenant/slug")
        name = r.text("name", max_length=200)
        _once(seen, f"{use_case}:{name}", path, problems)
        keys.append(KeySpec(use_case=use_case, name=name))
    return tuple(keys)


# --- references between sections ----------------------------------------------------------
@dataclass(frozen=True)
class Known:
    """Ids a reference may point at, per kind; None where the file cannot tell (section absent).

    ``where`` says, for the message, where a name was looked for.
    """

    models: frozenset[str] | None
    tenants: frozenset[str] | None
    use_cases: frozenset[str] | None
    priority_classes: frozenset[str] | None
    where: str = "in the file"
    # model id → what ``model@…`` may name (its versions and aliases); None as for models
    routes: Mapping[str, frozenset[str]] | None = None

    @classmethod
    def of(cls, document: PolicyDocument) -> Known:
        return cls(
            models=_ids(document.models, lambda m: m.id),
            tenants=_ids(document.tenants, lambda t: t.id),
            use_cases=_ids(document.use_cases, lambda u: u.id),
            priority_classes=_ids(document.priority_classes, lambda c: c.name),
            routes=(
                None
                if document.models is None
                else {
                    m.id: frozenset(model_routing.targets(m.routing, m.versions()))
                    for m in document.models
                }
            ),
        )


def _ids(records: tuple[T, ...] | None, ident: Callable[[T], str]) -> frozenset[str] | None:
    return None if records is None else frozenset(ident(r) for r in records)


def reference_problems(document: PolicyDocument, known: Known) -> list[Problem]:
    """Every reference that names something ``known`` does not hold."""
    problems: list[Problem] = []

    def check(path: str, kind: str, value: str | None, ids: frozenset[str] | None) -> None:
        if value and ids is not None and value not in ids:
            problems.append(Problem(path, f"unknown {kind} {value!r} (not defined {known.where})"))

    for use_case in document.use_cases or ():
        path = f"use_cases[{use_case.id}]"
        check(f"{path}.id", "tenant", use_case.tenant, known.tenants)
        for index, model in enumerate(use_case.models):
            check(f"{path}.models[{index}]", "model", model, known.models)
        for model, target in use_case.model_pins.items():
            check(f"{path}.model_pins.{model}", "model", model, known.models)
            targets = None if known.routes is None else known.routes.get(model)
            if targets is not None and target not in targets:
                listed = ", ".join(sorted(targets)) or "none: it has no versions"
                problems.append(
                    Problem(
                        f"{path}.model_pins.{model}",
                        f"{target!r} is not a version or an alias of {model} ({listed})",
                    )
                )
        for sla in use_case.sla_classes:
            check(
                f"{path}.sla_classes[{sla.name}].priority_class",
                "priority class",
                sla.priority_class,
                known.priority_classes,
            )
    for environment, row in (document.priority_matrix or {}).items():
        for namespace, class_name in row.items():
            check(
                f"priority_matrix.{environment}.{namespace}",
                "priority class",
                class_name,
                known.priority_classes,
            )
    for spec in document.models or ():
        check(
            f"models[{spec.id}].lifecycle.successor",
            "model",
            spec.lifecycle.successor,
            known.models,
        )
    for policy in document.rate_limits or ():
        check(f"rate_limits[{policy.name}].model", "model", policy.model, known.models)
        check(f"rate_limits[{policy.name}].tenant", "tenant", policy.tenant, known.tenants)
    for index, key in enumerate(document.keys or ()):
        check(f"keys[{index}].use_case", "use case", key.use_case, known.use_cases)
    return problems


# --- the file ------------------------------------------------------------------------------
class _StrictLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, refusing duplicate keys instead of keeping the last one.

    A duplicated key (two ``prod:`` rows in the matrix, two ``limits:``) silently losing half
    of what someone wrote is exactly the mistake a review will not catch.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<: *defaults`` may be overridden by the keys beside it
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:
                continue  # an unhashable key: the base constructor reports it
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"found the key {key!r} twice",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def _yaml_problem(exc: yaml.YAMLError) -> Problem:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}"
        return Problem(where, f"not valid YAML: {exc.problem}")
    return Problem("", f"not valid YAML: {exc}")


def policy_parse(data: Any) -> PolicyDocument:
    """Check loaded YAML and build the document; raise ``PolicyInvalid`` with every problem."""
    problems: list[Problem] = []
    if not isinstance(data, dict):
        raise PolicyInvalid([Problem("", "the file must be a mapping with a version: 1 line")])
    if data.get("version") != FORMAT_VERSION:
        problems.append(Problem("version", f"must be {FORMAT_VERSION}"))
    for key in data:
        if key != "version" and key not in SECTIONS:
            hint = difflib.get_close_matches(str(key), SECTIONS, n=1)
            suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
            problems.append(Problem(str(key), f"unknown section{suggestion}"))

    def section(name: str, parse: Callable[[Any, list[Problem]], T]) -> T | None:
        if name not in data:
            return None
        # ``models: []`` and a bare ``models:`` both mean "none", and the section is managed.
        return parse(data[name] if data[name] is not None else [], problems)

    document = PolicyDocument(
        models=section("models", _models),
        tenants=section("tenants", _tenants),
        use_cases=section("use_cases", _use_cases),
        priority_classes=section("priority_classes", _priority_classes),
        priority_matrix=section(
            "priority_matrix", lambda raw, p: _priority_matrix(raw if raw != [] else {}, p)
        ),
        rate_limits=section("rate_limits", _rate_limits),
        keys=section("keys", _keys),
    )
    problems.extend(reference_problems(document, Known.of(document)))
    if problems:
        raise PolicyInvalid(problems)
    return document


def policy_load(text: str) -> PolicyDocument:
    """Parse the text of a policy file."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise PolicyInvalid([_yaml_problem(exc)]) from None
    return policy_parse(data)
