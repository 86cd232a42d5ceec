"""The diff between a policy file and the database, as pure functions over two documents.

Both sides are flattened into records — a natural key and a mapping of comparable fields per
governance row — so that one generic comparison serves every section and a plan can show
field-level before → after. What apply does is exactly what the plan lists.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from django.utils import timezone

from governance.choices import UseCaseStatus
from governance.policy_as_code.errors import PolicyInvalid, Problem
from governance.policy_as_code.schema import (
    Known,
    LifecycleSpec,
    ModelSpec,
    PolicyDocument,
    UseCaseSpec,
    reference_problems,
)
from governance.prices import amount_text, history_problem, moment_text, price_moment
from governance.services.use_cases import USE_CASE_TRANSITIONS

Key = tuple[str, ...]
Record = dict[str, Any]


class Section(StrEnum):
    """Kinds of record, in the order a plan lists them."""

    MODELS = "models"
    DEPLOYMENTS = "deployments"
    MODEL_PRICES = "model_prices"
    TENANTS = "tenants"
    USE_CASES = "use_cases"
    GUARDRAILS = "guardrails"
    SLA_CLASSES = "sla_classes"
    PRIORITY_CLASSES = "priority_classes"
    PRIORITY_MATRIX = "priority_matrix"
    RATE_LIMITS = "rate_limits"
    KEYS = "keys"


class Action(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"
    RETIRE = "retire"  # use cases are never deleted: pruning one retires it
    MINT = "mint"


_SECTION_ORDER = list(Section)
_ACTION_ORDER = list(Action)


def record_path(section: Section, key: Key) -> str:
    """Where a record lives in the file, in the same notation as validation problems."""
    match section:
        case Section.DEPLOYMENTS:
            return f"models[{key[0]}].deployments[{key[1]}]"
        case Section.MODEL_PRICES:
            return f"models[{key[0]}].prices[{key[1]}]"
        case Section.USE_CASES:
            return f"use_cases[{key[0]}/{key[1]}]"
        case Section.GUARDRAILS:
            return f"use_cases[{key[0]}/{key[1]}].guardrails[{key[2]}:{key[3]}]"
        case Section.SLA_CLASSES:
            return f"use_cases[{key[0]}/{key[1]}].sla_classes[{key[2]}]"
        case Section.PRIORITY_MATRIX:
            return f"priority_matrix.{key[0]}.{key[1]}"
        case Section.KEYS:
            return f"keys[{key[0]}:{key[1]}]"
        case _:
            return f"{section.value}[{key[0]}]"


@dataclass(frozen=True)
class FieldChange:
    name: str
    before: Any
    after: Any


@dataclass(frozen=True)
class Change:
    """One thing apply will do to one record."""

    action: Action
    section: Section
    key: Key
    before: Record | None = None  # the database's record; None when it is created
    after: Record | None = None  # the record as it will be; None when it is deleted
    # Use cases only: the lifecycle transitions that reach the wanted status, and the reason
    # the file gives for them (apply supplies one where a transition requires it).
    transitions: tuple[str, ...] = ()
    reason: str = ""
    # Tenants and use cases: why the file places or lifts a legal hold (for the audit trail).
    hold_reason: str = ""

    @property
    def path(self) -> str:
        return record_path(self.section, self.key)

    @property
    def fields(self) -> tuple[FieldChange, ...]:
        before, after = self.before or {}, self.after or {}
        if self.action is Action.CREATE:
            return tuple(FieldChange(name, None, value) for name, value in after.items())
        if self.action is Action.DELETE:
            return tuple(FieldChange(name, value, None) for name, value in before.items())
        return tuple(
            FieldChange(name, before.get(name), value)
            for name, value in after.items()
            if before.get(name) != value
        )

    def changed(self) -> Record:
        """The fields an update sets, by their record names."""
        return {f.name: f.after for f in self.fields}


@dataclass(frozen=True)
class Note:
    """Something the plan leaves alone on purpose, said so that nobody is surprised."""

    path: str
    message: str


@dataclass(frozen=True)
class Plan:
    changes: tuple[Change, ...] = ()
    notes: tuple[Note, ...] = ()
    prune: bool = False
    mint_keys: bool = False

    @property
    def has_changes(self) -> bool:
        return bool(self.changes)

    def of(self, section: Section, *actions: Action) -> list[Change]:
        return [c for c in self.changes if c.section is section and c.action in actions]

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(Action, 0)
        for change in self.changes:
            counts[change.action] += 1
        return {action.value: count for action, count in counts.items()}


# --- documents as records -------------------------------------------------------------------
# Lists whose order means nothing (capabilities, replicas, allowed models …) are compared
# sorted, so reordering a list in the file is not a change.
def _model_record(model: ModelSpec) -> Record:
    record: Record = {
        "description": model.description,
        "capabilities": sorted(model.capabilities),
        "timeout_seconds": float(model.timeout_seconds),
        "max_tokens": model.max_tokens,
        "routing": dict(model.routing),
    }
    # An active model's record says nothing of its lifecycle (a plan that creates one lists
    # no lifecycle fields); ``_lifecycle_on_both_sides`` completes it against a model that has.
    if model.lifecycle != LifecycleSpec():
        record.update(_lifecycle_record(model.lifecycle))
    return record


def _lifecycle_record(lifecycle: LifecycleSpec) -> Record:
    return {
        "lifecycle.status": lifecycle.status,
        "lifecycle.sunset_at": moment_text(lifecycle.sunset_at) if lifecycle.sunset_at else None,
        "lifecycle.successor": lifecycle.successor,
        "lifecycle.notice_url": lifecycle.notice_url,
        "lifecycle.at_sunset": lifecycle.at_sunset,
    }


def _lifecycle_on_both_sides(want: dict[Key, Record] | None, have: dict[Key, Record]) -> None:
    """Where one side of a model has lifecycle fields and the other none (it is active),
    give that one an active model's, so that the change (a deprecation, or back to active) is
    planned field by field."""
    active = _lifecycle_record(LifecycleSpec())
    for key in (want or {}).keys() & have.keys():
        assert want is not None
        mine, theirs = want[key], have[key]
        if ("lifecycle.status" in mine) != ("lifecycle.status" in theirs):
            for record in (mine, theirs):
                for name, value in active.items():
                    record.setdefault(name, value)


def _use_case_record(use_case: UseCaseSpec) -> Record:
    limits = use_case.limits
    return {
        "name": use_case.name,
        "kind": use_case.kind,
        "purpose": use_case.purpose,
        "data_classification": use_case.data_classification,
        "namespace": use_case.namespace,
        "ticket_ref": use_case.ticket_ref,
        "service_account_client_id": use_case.service_account_client_id,
        "guardrail_failure": use_case.guardrail_failure,
        "models": sorted(use_case.models),
        "model_pins": dict(use_case.model_pins),
        "model_fallbacks": {
            model: list(chain) for model, chain in use_case.model_fallbacks.items()
        },
        "limits.requests_per_minute": limits.requests_per_minute,
        "limits.tokens_per_minute": limits.tokens_per_minute,
        "limits.tokens_per_day": limits.tokens_per_day,
        "limits.max_concurrent": limits.max_concurrent,
        "records.policy": use_case.records.policy,
        "records.retention_days": use_case.records.retention_days,
        "records.developers_can_read": use_case.records.developers_can_read,
        "async_tasks.result_ttl_seconds": use_case.async_tasks.result_ttl_seconds,
        "async_tasks.cache_seconds": use_case.async_tasks.cache_seconds,
        # None (the file says nothing) is resolved against the database by the plan.
        "legal_hold": use_case.legal_hold,
        "status": use_case.status,
    }


def document_records(document: PolicyDocument) -> dict[Section, dict[Key, Record] | None]:
    """Every record of the document by section; None for a section the document leaves out."""
    models, use_cases = document.models, document.use_cases
    records: dict[Section, dict[Key, Record] | None] = dict.fromkeys(Section)
    if models is not None:
        records[Section.MODELS] = {(m.id,): _model_record(m) for m in models}
        records[Section.DEPLOYMENTS] = {
            (m.id, d.served_name): {
                "replicas": sorted(d.replicas),
                "node_pool": d.node_pool,
                "version": d.version,
                "lora_adapters": sorted(d.lora_adapters),
                "max_in_flight_per_replica": d.max_in_flight_per_replica,
                "active": d.active,
            }
            for m in models
            for d in m.deployments
        }
        # Amounts as their exact digits: JSON-safe for the plan, and "0.50" equals "0.5".
        records[Section.MODEL_PRICES] = {
            (m.id, moment_text(p.effective_from)): {
                "input_per_mtok": amount_text(p.input_per_mtok),
                "output_per_mtok": amount_text(p.output_per_mtok),
            }
            for m in models
            for p in m.prices or ()
        }
    if document.tenants is not None:
        records[Section.TENANTS] = {
            (t.id,): {
                "name": t.name,
                "business_unit": t.business_unit,
                "application_id": t.application_id,
                "environment": t.environment,
                "owner_email": t.owner_email,
                "contacts": sorted(t.contacts),
                "legal_hold": t.legal_hold,
            }
            for t in document.tenants
        }
    if use_cases is not None:
        records[Section.USE_CASES] = {(u.tenant, u.slug): _use_case_record(u) for u in use_cases}
        records[Section.GUARDRAILS] = {
            (u.tenant, u.slug, g.side, g.guardrail): {
                "action": g.action,
                "config": g.config,
                "position": g.position,
            }
            for u in use_cases
            for g in u.guardrails
        }
        records[Section.SLA_CLASSES] = {
            (u.tenant, u.slug, c.name): {
                "description": c.description,
                "turnaround_seconds": c.turnaround_seconds,
                "windows": [dict(w) for w in c.windows],
                "time_zone": c.time_zone,
                "priority_class": c.priority_class,
                "max_file_bytes": c.max_file_bytes,
                "kinds": sorted(c.kinds),
            }
            for u in use_cases
            for c in u.sla_classes
        }
    if document.priority_classes is not None:
        records[Section.PRIORITY_CLASSES] = {
            (c.name,): {
                "rank": c.rank,
                "vllm_priority": c.vllm_priority,
                "queue_timeout_seconds": float(c.queue_timeout_seconds),
                "max_queue_length": c.max_queue_length,
                "max_pool_share": float(c.max_pool_share),
                "degrade_after_seconds": (
                    None if c.degrade_after_seconds is None else float(c.degrade_after_seconds)
                ),
            }
            for c in document.priority_classes
        }
    if document.priority_matrix is not None:
        records[Section.PRIORITY_MATRIX] = {
            (environment, namespace): {"class": class_name}
            for environment, row in document.priority_matrix.items()
            for namespace, class_name in row.items()
        }
    if document.rate_limits is not None:
        records[Section.RATE_LIMITS] = {
            (p.name,): {
                "scope": p.scope,
                "model": p.model,
                "tenant": p.tenant,
                "requests_per_minute": p.requests_per_minute,
                "tokens_per_minute": p.tokens_per_minute,
                "tokens_per_day": p.tokens_per_day,
            }
            for p in document.rate_limits
        }
    if document.keys is not None:
        records[Section.KEYS] = {(k.use_case, k.name): {} for k in document.keys}
    return records


# --- use-case lifecycle ---------------------------------------------------------------------
def transitions_between(start: str, target: str) -> tuple[str, ...] | None:
    """The shortest run of lifecycle transitions from one status to another; None if none."""
    if start == target:
        return ()
    frontier: deque[tuple[str, tuple[str, ...]]] = deque([(start, ())])
    seen = {start}
    while frontier:
        state, path = frontier.popleft()
        for name, (sources, end, _who, _needs_reason) in USE_CASE_TRANSITIONS.items():
            if state not in sources or end in seen:
                continue
            if end == target:
                return (*path, name)
            seen.add(end)
            frontier.append((end, (*path, name)))
    return None


def _lifecycle_problem(key: Key, start: str, target: str) -> Problem:
    return Problem(
        f"{record_path(Section.USE_CASES, key)}.status",
        f"cannot go from {start} to {target}: use cases move draft → submitted → approved ⇄ "
        "suspended, back to draft only when rejected, and stay retired",
    )


# --- the plan -------------------------------------------------------------------------------
def _known(desired: PolicyDocument, current: PolicyDocument) -> Known:
    """References resolve within the file's sections, else against the database."""
    mine, theirs = Known.of(desired), Known.of(current)
    return Known(
        models=mine.models if mine.models is not None else theirs.models,
        tenants=mine.tenants if mine.tenants is not None else theirs.tenants,
        use_cases=mine.use_cases if mine.use_cases is not None else theirs.use_cases,
        priority_classes=(
            mine.priority_classes if mine.priority_classes is not None else theirs.priority_classes
        ),
        where="in the file, nor in the database for a section the file leaves out",
        routes=mine.routes if mine.routes is not None else theirs.routes,
    )


@dataclass
class _Builder:
    desired: PolicyDocument
    current: PolicyDocument
    prune: bool
    mint_keys: bool
    now: datetime
    want: dict[Section, dict[Key, Record] | None] = field(init=False)
    have: dict[Section, dict[Key, Record]] = field(init=False)
    changes: list[Change] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.want = document_records(self.desired)
        self.have = {s: r or {} for s, r in document_records(self.current).items()}
        _lifecycle_on_both_sides(self.want[Section.MODELS], self.have[Section.MODELS])

    def orphans(self, section: Section) -> list[Key]:
        wanted = self.want[section]
        return [] if wanted is None else sorted(self.have[section].keys() - wanted.keys())

    def keep(self, section: Section, key: Key, message: str) -> None:
        self.notes.append(Note(record_path(section, key), message))

    def remove(self, section: Section, key: Key, *, verb: str = "deletes") -> bool:
        """Delete with --prune; otherwise note that the record stays. True when it goes."""
        if self.prune:
            self.changes.append(Change(Action.DELETE, section, key, before=self.have[section][key]))
            return True
        self.keep(section, key, f"not in the file; kept (apply --prune {verb} it)")
        return False

    # -- creates and updates
    def upserts(self) -> None:
        reasons: dict[Key, str] = {
            (u.tenant, u.slug): u.status_reason for u in self.desired.use_cases or ()
        }
        hold_reasons: dict[tuple[Section, Key], str] = {
            (Section.USE_CASES, (u.tenant, u.slug)): u.legal_hold_reason
            for u in self.desired.use_cases or ()
        } | {(Section.TENANTS, (t.id,)): t.legal_hold_reason for t in self.desired.tenants or ()}
        for section in Section:
            wanted = self.want[section]
            if wanted is None or section is Section.KEYS:
                continue
            for key, record in sorted(wanted.items()):
                old = self.have[section].get(key)
                hold_reason = hold_reasons.get((section, key), "")
                if "legal_hold" in record:
                    record = self._resolve_hold(section, key, record, old, hold_reason)
                if old == record:
                    continue
                action = Action.CREATE if old is None else Action.UPDATE
                change: Change | None = Change(
                    action,
                    section,
                    key,
                    before=old,
                    after=record,
                    hold_reason=hold_reason,
                )
                if change is not None and section is Section.USE_CASES:
                    change = self._with_lifecycle(change, reasons.get(key, ""))
                if change is not None:
                    self.changes.append(change)

    def _resolve_hold(
        self, section: Section, key: Key, record: Record, old: Record | None, reason: str
    ) -> Record:
        """A hold the file says nothing about stays as it is (an old file must not lift one);
        lifting one takes a reason, as placing one does."""
        held = bool(old and old["legal_hold"])
        if record["legal_hold"] is None:
            if held:
                self.keep(
                    section,
                    key,
                    "on legal hold; kept (write legal_hold: false with a legal_hold_reason "
                    "to lift it)",
                )
            return {**record, "legal_hold": held}
        if held and record["legal_hold"] is False and not reason.strip():
            self.problems.append(
                Problem(
                    f"{record_path(section, key)}.legal_hold_reason",
                    "is required to lift a legal hold (say why)",
                )
            )
        return record

    def _with_lifecycle(self, change: Change, reason: str) -> Change | None:
        assert change.after is not None
        start = change.before["status"] if change.before else UseCaseStatus.DRAFT.value
        target = change.after["status"]
        path = transitions_between(start, target)
        if path is None:
            self.problems.append(_lifecycle_problem(change.key, start, target))
            return None
        return replace(change, transitions=path, reason=reason)

    def service_account_clashes(self) -> None:
        """A client the file binds that a use case the file does not list holds: apply would
        trip over its uniqueness, so say so at plan time, where the file can still change."""
        wanted = self.want[Section.USE_CASES]
        if wanted is None:
            return
        holders = {
            record["service_account_client_id"]: key
            for key, record in self.have[Section.USE_CASES].items()
            if record["service_account_client_id"] and key not in wanted
        }
        for key, record in sorted(wanted.items()):
            holder = holders.get(record["service_account_client_id"])
            if holder is not None:
                self.problems.append(
                    Problem(
                        f"{record_path(Section.USE_CASES, key)}.service_account_client_id",
                        f"client {record['service_account_client_id']!r} is bound to use case "
                        f"{holder[0]}/{holder[1]} in the database, which the file does not "
                        "list; unbind it there first",
                    )
                )

    # -- records in the database that the file does not list
    def orphan_rate_limits_and_matrix(self) -> None:
        for key in self.orphans(Section.RATE_LIMITS):
            self.remove(Section.RATE_LIMITS, key)
        for key in self.orphans(Section.PRIORITY_MATRIX):
            self.remove(Section.PRIORITY_MATRIX, key)

    def orphan_use_cases(self) -> None:
        wanted_use_cases = self.want[Section.USE_CASES] or {}
        for key in self.orphans(Section.GUARDRAILS):
            if key[:2] in wanted_use_cases:  # a retired use case keeps its guardrails
                self.remove(Section.GUARDRAILS, key)
        for key in self.orphans(Section.SLA_CLASSES):
            if key[:2] in wanted_use_cases:  # ...and its SLA classes
                self.remove(Section.SLA_CLASSES, key)
        for key in self.orphans(Section.USE_CASES):
            record = self.have[Section.USE_CASES][key]
            if record["status"] == UseCaseStatus.RETIRED:
                continue
            if not self.prune:
                message = "not in the file; kept (apply --prune retires it)"
                self.keep(Section.USE_CASES, key, message)
                continue
            self.changes.append(
                Change(
                    Action.RETIRE,
                    Section.USE_CASES,
                    key,
                    before=record,
                    after={**record, "status": UseCaseStatus.RETIRED.value},
                    transitions=("retire",),
                    reason="not in the policy file (pruned)",
                )
            )

    # -- prices: what is already in force is history (governance/prices.py)
    def _priced_models(self) -> set[str]:
        """The models whose prices the file manages (it lists ``prices:`` for them)."""
        return {m.id for m in self.desired.models or () if m.prices is not None}

    def price_history(self) -> None:
        starts: dict[str, list[datetime]] = {}
        for model, start in self.have[Section.MODEL_PRICES]:
            starts.setdefault(model, []).append(price_moment(start))
        for change in self.changes:
            if change.section is not Section.MODEL_PRICES:
                continue
            model, start = change.key
            problem = history_problem(
                starts=starts.get(model, ()),
                effective_from=price_moment(start),
                creating=change.action is Action.CREATE,
                now=self.now,
            )
            if problem is not None:
                self.problems.append(Problem(change.path, problem))

    def orphan_prices(self) -> None:
        managed = self._priced_models()
        for key in self.orphans(Section.MODEL_PRICES):
            if key[0] not in managed:
                continue  # the file says nothing of this model's prices (or of the model)
            if price_moment(key[1]) <= self.now:
                self.keep(
                    Section.MODEL_PRICES,
                    key,
                    "not in the file; kept, since it is in force (prices in force are history)",
                )
            else:
                self.remove(Section.MODEL_PRICES, key)

    def orphan_models(self) -> None:
        orphan_models = set(self.orphans(Section.MODELS))
        for key in self.orphans(Section.DEPLOYMENTS):
            if key[:1] in orphan_models and not self.prune:
                continue  # the model's own note covers its deployments
            self.remove(Section.DEPLOYMENTS, key)
        dropped: set[str] = set()
        for key in sorted(orphan_models):
            if self._blocked_by_rate_limits(Section.MODELS, key, "model"):
                continue
            if self.remove(Section.MODELS, key):
                dropped.add(key[0])
        self._drop_models_from_use_cases(dropped)

    def _drop_models_from_use_cases(self, dropped: set[str]) -> None:
        """A deleted model leaves the allowed models (and the pins and fallback chains) of use
        cases the file does not list."""
        if not dropped:
            return
        wanted = self.want[Section.USE_CASES] or {}
        for key, record in sorted(self.have[Section.USE_CASES].items()):
            if key in wanted or not dropped & {*record["models"], *record["model_pins"]}:
                continue
            remaining = [m for m in record["models"] if m not in dropped]
            pins = {m: pin for m, pin in record["model_pins"].items() if m not in dropped}
            chains = {
                m: [f for f in chain if f not in dropped]
                for m, chain in record["model_fallbacks"].items()
                if m not in dropped
            }
            self.changes.append(
                Change(
                    Action.UPDATE,
                    Section.USE_CASES,
                    key,
                    before=record,
                    after={
                        **record,
                        "models": remaining,
                        "model_pins": pins,
                        "model_fallbacks": {m: chain for m, chain in chains.items() if chain},
                    },
                )
            )

    def _blocked_by_rate_limits(self, section: Section, key: Key, field_name: str) -> bool:
        """A rate limit the file does not manage would silently go with the record: refuse."""
        if not self.prune or self.want[Section.RATE_LIMITS] is not None:
            return False
        users = sorted(
            name
            for (name,), record in self.have[Section.RATE_LIMITS].items()
            if record[field_name] == key[0]
        )
        if users:
            self.problems.append(
                Problem(
                    record_path(section, key),
                    f"cannot delete: rate limits {', '.join(users)} refer to it and the file "
                    "has no rate_limits section",
                )
            )
        return bool(users)

    def orphan_tenants(self) -> None:
        use_case_tenants = {tenant for tenant, _slug in self.have[Section.USE_CASES]}
        for key in self.orphans(Section.TENANTS):
            if key[0] in use_case_tenants:
                self.keep(
                    Section.TENANTS,
                    key,
                    "not in the file; kept, since it has use cases (tenants with a history "
                    "are never deleted)",
                )
            elif not self._blocked_by_rate_limits(Section.TENANTS, key, "tenant"):
                self.remove(Section.TENANTS, key)

    def orphan_priority_classes(self) -> None:
        for key in self.orphans(Section.PRIORITY_CLASSES):
            if self.prune and self.want[Section.PRIORITY_MATRIX] is None:
                cells = sorted(
                    record_path(Section.PRIORITY_MATRIX, cell)
                    for cell, record in self.have[Section.PRIORITY_MATRIX].items()
                    if record["class"] == key[0]
                )
                if cells:
                    self.problems.append(
                        Problem(
                            record_path(Section.PRIORITY_CLASSES, key),
                            f"cannot delete: {', '.join(cells)} use it and the file has no "
                            "priority_matrix section",
                        )
                    )
                    continue
            self.remove(Section.PRIORITY_CLASSES, key)

    def keys(self) -> None:
        wanted = self.want[Section.KEYS]
        for key in sorted(wanted or {}):
            if key in self.have[Section.KEYS]:
                continue
            if self.mint_keys:
                self.changes.append(Change(Action.MINT, Section.KEYS, key))
            else:
                self.keep(Section.KEYS, key, "has no active key (apply --mint-keys mints one)")

    def build(self) -> Plan:
        self.upserts()
        self.price_history()
        self.service_account_clashes()
        self.orphan_rate_limits_and_matrix()
        self.orphan_use_cases()
        self.orphan_prices()
        self.orphan_models()
        self.orphan_tenants()
        self.orphan_priority_classes()
        self.keys()
        if self.problems:
            raise PolicyInvalid(self.problems)
        return Plan(
            changes=tuple(sorted(self.changes, key=_display_order)),
            notes=tuple(sorted(self.notes, key=lambda n: n.path)),
            prune=self.prune,
            mint_keys=self.mint_keys,
        )


def _display_order(change: Change) -> tuple[int, Key, int]:
    return (_SECTION_ORDER.index(change.section), change.key, _ACTION_ORDER.index(change.action))


def plan_build(
    desired: PolicyDocument,
    current: PolicyDocument,
    *,
    prune: bool = False,
    mint_keys: bool = False,
    now: datetime | None = None,
) -> Plan:
    """What it takes to bring ``current`` (the database) to ``desired`` (the file).

    Raises ``PolicyInvalid`` when the file cannot be applied to this database: a reference to
    a record neither defines, a status no lifecycle path reaches, a prune that would silently
    take records of a section the file does not manage with it, a price change that would
    reprice usage already priced (judged at ``now``).
    """
    problems = reference_problems(desired, _known(desired, current))
    if problems:
        raise PolicyInvalid(problems)
    return _Builder(desired, current, prune, mint_keys, now or timezone.now()).build()
