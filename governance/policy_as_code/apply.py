"""Carry a plan out through the governance services: audited, all or nothing, published once.

Every write goes through ``governance.services`` — the same validation, authorisation and
audit trail as the portal and the API — inside one transaction: the first refusal rolls the
whole apply back, so a half-applied policy never reaches the gateway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from django.core.exceptions import ObjectDoesNotExist, PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Model as DjangoModel
from django.db.models import ProtectedError

from governance import model_routing
from governance.audit import Actor
from governance.errors import GovernanceError
from governance.models import (
    AuditChainHead,
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
    stale_pins,
)
from governance.policy_as_code.errors import PolicyApplyFailed, PolicyInvalid, Problem
from governance.policy_as_code.plan import (
    Action,
    Change,
    Key,
    Plan,
    Record,
    Section,
    plan_build,
    record_path,
)
from governance.policy_as_code.schema import PolicyDocument
from governance.policy_as_code.selectors import policy_current
from governance.prices import (
    model_price_add,
    model_price_delete,
    model_price_update,
    price_moment,
)
from governance.services.api_keys import api_key_issue
from governance.services.generic_records import record_create, record_delete, record_update
from governance.services.record_policy import tenant_set_legal_hold, use_case_set_legal_hold
from governance.services.use_cases import (
    USE_CASE_TRANSITIONS,
    use_case_create,
    use_case_transition,
    use_case_update,
)
from governance.sla_classes import sla_class_create, sla_class_delete, sla_class_update

logger = logging.getLogger(__name__)

_UPSERT = (Action.CREATE, Action.UPDATE)
_CLIENT = "service_account_client_id"
_LIMITS_PREFIX = "limits."
_HOLD = "legal_hold"
# The file's names under ``records:`` → the use case's fields.
_RECORDS_FIELDS = {
    "records.policy": "record_policy",
    "records.retention_days": "record_retention_days",
    "records.developers_can_read": "records_visible_to_developers",
    # and under ``async_tasks:``
    "async_tasks.result_ttl_seconds": "async_result_ttl_seconds",
    "async_tasks.cache_seconds": "async_cache_seconds",
}


@dataclass(frozen=True)
class MintedKey:
    use_case: str
    name: str
    prefix: str
    plaintext: str = field(repr=False)  # shown to the operator once; never logged or stored


@dataclass(frozen=True)
class ApplyResult:
    plan: Plan
    minted: tuple[MintedKey, ...] = ()


def _validation_message(exc: ValidationError) -> str:
    if hasattr(exc, "error_dict"):
        return "; ".join(
            f"{name}: {' '.join(messages)}" if name != "__all__" else " ".join(messages)
            for name, messages in exc.message_dict.items()
        )
    return " ".join(exc.messages)


@contextmanager
def _blame(path: str) -> Iterator[None]:
    """Turn a service's refusal into a problem at the record's place in the file."""
    try:
        yield
    except PolicyInvalid:
        raise
    except ValidationError as exc:
        raise PolicyApplyFailed([Problem(path, _validation_message(exc))]) from exc
    except (
        PermissionDenied,
        GovernanceError,
        ProtectedError,
        IntegrityError,
        ObjectDoesNotExist,
    ) as exc:
        raise PolicyApplyFailed([Problem(path, str(exc))]) from exc


def _use_case_fields(record: Record) -> dict[str, Any]:
    """Record names to model fields; models, status and the legal hold have their own
    services."""
    return {
        _RECORDS_FIELDS.get(name, name.removeprefix(_LIMITS_PREFIX)): value
        for name, value in record.items()
        if name not in ("models", "status", _HOLD)
    }


def _fallbacks_later(
    use_case: UseCase, fields: dict[str, Any], allowed: list[Model] | None
) -> dict[str, list[str]] | None:
    """The chains to set once the use case's new ``models`` are in place, when they name a
    model it is only now given (the use case checks its chains against the models it has);
    meanwhile ``fields`` keep of them what it may call already. None when nothing waits."""
    wanted = fields.get("model_fallbacks")
    if not wanted or allowed is None:
        return None
    now = set(use_case.allowed_models.values_list("public_id", flat=True))
    chains = {m: [f for f in chain if f in now] for m, chain in wanted.items() if m in now}
    interim = {m: chain for m, chain in chains.items() if chain}
    if interim == wanted:
        return None
    fields["model_fallbacks"] = interim
    return dict(wanted)


def _hold_reason(change: Change, hold: bool) -> str:
    # Placing needs the file's reason (the schema requires it); so does lifting (the plan).
    return change.hold_reason or f"{'placed' if hold else 'lifted'} by the policy file"


def _place_in_file(change: Change) -> tuple[Key, int]:
    """A use case's guardrails are created and moved in the order of their places in the
    file: each lands in its place after the ones before it, so the result is the file's order
    whatever the order before."""
    assert change.after is not None
    return change.key[:2], int(change.after.get("position", 0))


class _Applier:
    def __init__(self, actor: Actor, plan: Plan) -> None:
        self.actor = actor
        self.plan = plan
        self._models: dict[str, Model] = {}
        self._tenants: dict[str, Tenant] = {}
        self._classes: dict[str, PriorityClass] = {}
        # model id → the routing to set once its deployments are in place (model_upsert)
        self._routing_later: dict[str, dict[str, Any]] = {}
        self.minted: list[MintedKey] = []

    # -- lookups of records the plan names (some created earlier in this same apply)
    def model(self, public_id: str) -> Model:
        if public_id not in self._models:
            self._models[public_id] = Model.objects.get(public_id=public_id)
        return self._models[public_id]

    def tenant(self, slug: str) -> Tenant:
        if slug not in self._tenants:
            self._tenants[slug] = Tenant.objects.get(slug=slug)
        return self._tenants[slug]

    def priority_class(self, name: str) -> PriorityClass:
        if name not in self._classes:
            self._classes[name] = PriorityClass.objects.get(name=name)
        return self._classes[name]

    def use_case(self, key: Key) -> UseCase:
        return UseCase.objects.select_related("tenant").get(tenant__slug=key[0], slug=key[1])

    def row(self, section: Section, key: Key) -> DjangoModel:
        match section:
            case Section.MODELS:
                return self.model(key[0])
            case Section.DEPLOYMENTS:
                return Deployment.objects.get(model__public_id=key[0], served_name=key[1])
            case Section.TENANTS:
                return self.tenant(key[0])
            case Section.GUARDRAILS:
                return GuardrailSelection.objects.get(
                    use_case__tenant__slug=key[0],
                    use_case__slug=key[1],
                    side=key[2],
                    guardrail=key[3],
                )
            case Section.SLA_CLASSES:
                return SlaClass.objects.get(
                    use_case__tenant__slug=key[0], use_case__slug=key[1], name=key[2]
                )
            case Section.PRIORITY_CLASSES:
                return self.priority_class(key[0])
            case Section.PRIORITY_MATRIX:
                return PriorityRule.objects.get(environment=key[0], namespace=key[1])
            case Section.RATE_LIMITS:
                return RateLimitPolicy.objects.get(name=key[0])
        raise AssertionError(f"no single row for {section}")

    # -- the steps, in dependency order
    def run(self) -> tuple[MintedKey, ...]:
        delete = (Action.DELETE,)
        steps: list[tuple[Section, tuple[Action, ...], Callable[[Change], None]]] = [
            (Section.MODELS, _UPSERT, self.model_upsert),
            # Deployments go before others come or change (nothing refers to a deployment):
            # a model's versions then move in one direction (labelled or not) at a time.
            (Section.DEPLOYMENTS, delete, self.delete),
            (Section.DEPLOYMENTS, _UPSERT, self.upsert),
            # A routing that names versions the deployments above bring, once they are there.
            (Section.MODELS, _UPSERT, self.routing_later),
            (Section.MODEL_PRICES, _UPSERT, self.price_upsert),
            (Section.TENANTS, _UPSERT, self.tenant_upsert),
            (Section.USE_CASES, _UPSERT, self.use_case_upsert),
            # Removed guardrails first: one the file moves to another stage is a delete and a
            # create, and the create must not clash with the selection it replaces.
            (Section.GUARDRAILS, delete, self.delete),
            (Section.GUARDRAILS, _UPSERT, self.upsert),
            # Statuses move once the use case's guardrails are in place, so the trail never
            # shows a use case approved before its controls were.
            (Section.USE_CASES, _UPSERT, self.use_case_move),
            (Section.PRIORITY_CLASSES, _UPSERT, self.upsert),
            # SLA classes name priority classes: after those are in place, and removed
            # before a priority class they name could be.
            (Section.SLA_CLASSES, delete, self.sla_class_delete),
            (Section.SLA_CLASSES, _UPSERT, self.sla_class_upsert),
            (Section.PRIORITY_MATRIX, _UPSERT, self.upsert),
            (Section.RATE_LIMITS, _UPSERT, self.upsert),
            # Deletions run from dependents to what they depend on.
            (Section.RATE_LIMITS, delete, self.delete),
            (Section.PRIORITY_MATRIX, delete, self.delete),
            (Section.USE_CASES, (Action.RETIRE,), self.use_case_move),
            (Section.MODEL_PRICES, delete, self.price_delete),
            (Section.MODELS, delete, self.delete),
            (Section.TENANTS, delete, self.delete),
            (Section.PRIORITY_CLASSES, delete, self.delete),
            (Section.KEYS, (Action.MINT,), self.mint),
        ]
        with model_routing.pins_checked_at_the_end():
            self.apply_steps(steps)
        # Pins are checked once everything is in place: the routing moves in steps.
        stale = stale_pins()
        if stale:
            raise PolicyApplyFailed(
                Problem(
                    f"use_cases[{use_case}].model_pins.{model}",
                    f"'{pin}' is no longer a version or alias of '{model}'.",
                )
                for use_case, model, pin in stale
            )
        return tuple(self.minted)

    def apply_steps(
        self, steps: list[tuple[Section, tuple[Action, ...], Callable[[Change], None]]]
    ) -> None:
        for section, actions, step in steps:
            if section is Section.USE_CASES and step == self.use_case_upsert:
                self.vacate_service_accounts()
            if section is Section.PRIORITY_CLASSES and actions == _UPSERT:
                self.vacate_ranks()
            changes = self.plan.of(section, *actions)
            if section is Section.GUARDRAILS and actions == _UPSERT:
                changes = sorted(changes, key=_place_in_file)
            if section is Section.MODELS and actions == _UPSERT:
                changes = _successors_first(changes)
            if section is Section.DEPLOYMENTS and actions == _UPSERT:
                changes = sorted(changes, key=_deployment_order)
            for change in changes:
                with _blame(change.path):
                    step(change)

    def fields(self, section: Section, record: Record) -> dict[str, Any]:
        """Record names and values to model fields and values."""
        fields = dict(record)
        if section is Section.MODELS:
            return _model_fields(fields, self.model)
        if section is Section.PRIORITY_MATRIX:
            return {"priority_class": self.priority_class(fields.pop("class"))}
        if section is Section.RATE_LIMITS:
            for name, lookup in (("model", self.model), ("tenant", self.tenant)):
                if name in fields:
                    fields[name] = lookup(fields[name]) if fields[name] else None
        return fields

    def upsert(self, change: Change) -> None:
        if change.action is Action.UPDATE:
            record_update(
                actor=self.actor,
                instance=self.row(change.section, change.key),
                changes=self.fields(change.section, change.changed()),
            )
            return
        assert change.after is not None
        record_create(actor=self.actor, instance=self.new_row(change.section, change))

    def new_row(self, section: Section, change: Change) -> DjangoModel:
        assert change.after is not None
        fields, key = self.fields(section, change.after), change.key
        match section:
            case Section.MODELS:
                return Model(public_id=key[0], **fields)
            case Section.DEPLOYMENTS:
                return Deployment(model=self.model(key[0]), served_name=key[1], **fields)
            case Section.TENANTS:
                return Tenant(slug=key[0], **fields)
            case Section.GUARDRAILS:
                return GuardrailSelection(
                    use_case=self.use_case(key), side=key[2], guardrail=key[3], **fields
                )
            case Section.PRIORITY_CLASSES:
                return PriorityClass(name=key[0], **fields)
            case Section.PRIORITY_MATRIX:
                return PriorityRule(environment=key[0], namespace=key[1], **fields)
            case Section.RATE_LIMITS:
                return RateLimitPolicy(name=key[0], **fields)
        raise AssertionError(f"{section} records are not created as rows")

    def model_upsert(self, change: Change) -> None:
        """A model's fields; its routing now if the versions it names are deployed already,
        else once its deployments are in place (``routing_later``). Meanwhile a routing that
        names a version the file takes away keeps only what stays (it would block that)."""
        assert change.after is not None
        wanted = change.after.get("routing") or {}
        if change.action is Action.UPDATE and "routing" not in change.changed():
            self.upsert(change)
            return
        model = Model.objects.filter(public_id=change.key[0]).first()
        now = model.versions() if model is not None else set()
        if _named(wanted) <= now:
            self.upsert(change)
            return
        self._routing_later[change.key[0]] = wanted
        old: dict[str, Any] = dict(model.routing or {}) if model is not None else {}
        staying = now & self.versions_after(change.key[0])
        interim = old if _named(old) <= staying else _restricted(old, staying)
        self.upsert(replace(change, after={**change.after, "routing": interim}))

    def versions_after(self, public_id: str) -> set[str]:
        """The version labels of the model's active deployments once the plan is applied."""
        state = {
            d.served_name: (d.version, d.active)
            for d in Deployment.objects.filter(model__public_id=public_id)
        }
        for change in self.plan.of(Section.DEPLOYMENTS, *_UPSERT, Action.DELETE):
            if change.key[0] != public_id:
                continue
            if change.after is None:
                state.pop(change.key[1], None)
            else:
                state[change.key[1]] = (change.after["version"], change.after["active"])
        return {version for version, active in state.values() if version and active}

    def routing_later(self, change: Change) -> None:
        routing = self._routing_later.pop(change.key[0], None)
        if routing is not None:
            record_update(
                actor=self.actor, instance=self.model(change.key[0]), changes={"routing": routing}
            )

    def tenant_upsert(self, change: Change) -> None:
        """A tenant's fields through the record services; its hold through its own."""
        changed = change.changed() if change.action is Action.UPDATE else dict(change.after or {})
        hold = changed.pop(_HOLD, None)
        if change.action is Action.CREATE:
            record_create(actor=self.actor, instance=Tenant(slug=change.key[0], **changed))
        elif changed:
            record_update(actor=self.actor, instance=self.tenant(change.key[0]), changes=changed)
        if hold is not None:
            tenant_set_legal_hold(
                actor=self.actor,
                tenant=self.tenant(change.key[0]),
                hold=hold,
                reason=_hold_reason(change, hold),
            )

    def use_case_upsert(self, change: Change) -> None:
        if change.action is Action.CREATE:
            assert change.after is not None
            use_case = use_case_create(
                actor=self.actor,
                tenant=self.tenant(change.key[0]),
                fields={"slug": change.key[1], **_use_case_fields(change.after)},
                allowed_models=[self.model(m) for m in change.after["models"]],
            )
            self.use_case_hold(change, use_case, change.after.get(_HOLD))
            return
        changed = change.changed()
        fields = _use_case_fields(changed)
        models = changed.get("models")
        if fields or models is not None:  # otherwise only the status moves, in use_case_move
            use_case = self.use_case(change.key)
            assert change.after is not None
            # Also chains the file does not show (a model taken off the list has left them,
            # governance.snapshot), which the use case's check would otherwise stumble on.
            if use_case.model_fallbacks != change.after["model_fallbacks"]:
                fields["model_fallbacks"] = change.after["model_fallbacks"]
            allowed = None if models is None else [self.model(m) for m in models]
            later = _fallbacks_later(use_case, fields, allowed)
            use_case_update(
                actor=self.actor, use_case=use_case, changes=fields, allowed_models=allowed
            )
            if later is not None:
                use_case_update(
                    actor=self.actor, use_case=use_case, changes={"model_fallbacks": later}
                )
        self.use_case_hold(change, None, changed.get(_HOLD))

    def use_case_hold(self, change: Change, use_case: UseCase | None, hold: bool | None) -> None:
        if hold is None or (use_case is not None and use_case.legal_hold == hold):
            return
        use_case_set_legal_hold(
            actor=self.actor,
            use_case=use_case or self.use_case(change.key),
            hold=hold,
            reason=_hold_reason(change, hold),
        )

    def use_case_move(self, change: Change) -> None:
        if not change.transitions:
            return
        use_case = self.use_case(change.key)
        for transition in change.transitions:
            _sources, target, _who, needs_reason = USE_CASE_TRANSITIONS[transition]
            reason = change.reason
            if needs_reason and not reason:
                reason = f"declared {target} in the policy file"
            use_case = use_case_transition(
                actor=self.actor, use_case=use_case, transition=transition, reason=reason
            )

    def vacate_service_accounts(self) -> None:
        """Unbind the clients that move to another use case of the file, before any use case
        is written, so a binding moved (or swapped) between two use cases does not trip over
        its uniqueness half way; each use case's own update then binds what the file says."""
        upserts = self.plan.of(Section.USE_CASES, *_UPSERT)
        wanted = {
            c.after[_CLIENT]: c.key for c in upserts if c.after is not None and c.after[_CLIENT]
        }
        rebinding = {c.key for c in upserts if _CLIENT in c.changed()}
        holders = UseCase.objects.filter(service_account_client_id__in=list(wanted))
        for holder in holders.select_related("tenant").order_by("tenant__slug", "slug"):
            key = (holder.tenant.slug, holder.slug)
            if wanted[holder.service_account_client_id] == key or key not in rebinding:
                continue  # stays bound here; or a clash the plan or the service reports
            with _blame(record_path(Section.USE_CASES, key)):
                use_case_update(actor=self.actor, use_case=holder, changes={_CLIENT: ""})

    def vacate_ranks(self) -> None:
        """Free the ranks classes move to, so a swap of two ranks does not trip uniqueness.

        A class moving away, or being pruned, first steps aside to a spare rank; a class the
        file does not list and that stays keeps its rank, and the service reports the clash.
        """
        upserts = self.plan.of(Section.PRIORITY_CLASSES, *_UPSERT)
        wanted = {c.after["rank"]: c.key[0] for c in upserts if c.after is not None}
        if not wanted:
            return
        stepping_aside = {c.key[0] for c in upserts} | {
            c.key[0] for c in self.plan.of(Section.PRIORITY_CLASSES, Action.DELETE)
        }
        ranks = PriorityClass.objects.values_list("rank", flat=True)
        spare = max([*ranks, *wanted]) + 1
        for holder in PriorityClass.objects.filter(rank__in=list(wanted)).order_by("rank"):
            if wanted[holder.rank] == holder.name or holder.name not in stepping_aside:
                continue
            with _blame(record_path(Section.PRIORITY_CLASSES, (holder.name,))):
                record_update(actor=self.actor, instance=holder, changes={"rank": spare})
            self._classes[holder.name] = holder
            spare += 1

    def sla_class_upsert(self, change: Change) -> None:
        """Through the SLA-class services, so the file meets the rules the API does."""
        changed = change.changed() if change.action is Action.UPDATE else dict(change.after or {})
        if "priority_class" in changed:
            changed["priority_class"] = self.priority_class(changed["priority_class"])
        if change.action is Action.CREATE:
            sla_class_create(
                actor=self.actor,
                use_case=self.use_case(change.key),
                name=change.key[2],
                **changed,
            )
            return
        sla_class = self.row(change.section, change.key)
        assert isinstance(sla_class, SlaClass)
        sla_class_update(actor=self.actor, sla_class=sla_class, changes=changed)

    def sla_class_delete(self, change: Change) -> None:
        sla_class = self.row(change.section, change.key)
        assert isinstance(sla_class, SlaClass)
        sla_class_delete(actor=self.actor, sla_class=sla_class)

    def price(self, key: Key) -> ModelPrice:
        return ModelPrice.objects.select_related("model").get(
            model__public_id=key[0], effective_from=price_moment(key[1])
        )

    def price_upsert(self, change: Change) -> None:
        """Through the price services, which hold the history rule the plan checked."""
        assert change.after is not None
        amounts = {
            "input_per_mtok": change.after["input_per_mtok"],
            "output_per_mtok": change.after["output_per_mtok"],
        }
        if change.action is Action.CREATE:
            model_price_add(
                actor=self.actor,
                model=self.model(change.key[0]),
                effective_from=change.key[1],
                **amounts,
            )
        else:
            model_price_update(actor=self.actor, price=self.price(change.key), **amounts)

    def price_delete(self, change: Change) -> None:
        model_price_delete(actor=self.actor, price=self.price(change.key))

    def delete(self, change: Change) -> None:
        record_delete(actor=self.actor, instance=self.row(change.section, change.key))

    def mint(self, change: Change) -> None:
        use_case_id, name = change.key
        tenant, slug = use_case_id.split("/", 1)
        key, plaintext = api_key_issue(
            actor=self.actor, use_case=self.use_case((tenant, slug)), name=name
        )
        self.minted.append(
            MintedKey(use_case=use_case_id, name=name, prefix=key.prefix, plaintext=plaintext)
        )


def _serialise_applies() -> None:
    # Two applies planning at once would each plan against what the other is changing. The
    # audit chain's head row is locked by every audited write anyway; taking it first makes
    # concurrent applies (on PostgreSQL) run one after the other, each planning on the last.
    AuditChainHead.objects.select_for_update().filter(pk=1).first()


@transaction.atomic
def policy_apply(
    *,
    document: PolicyDocument,
    actor: Actor,
    prune: bool = False,
    mint_keys: bool = False,
) -> ApplyResult:
    """Make the database match the document; a second run of the same document does nothing.

    Raises ``PolicyInvalid`` when the plan cannot be made, and ``PolicyApplyFailed`` when a
    service refuses a change; either way nothing is written.
    """
    _serialise_applies()
    plan = plan_build(document, policy_current(), prune=prune, mint_keys=mint_keys)
    if not plan.has_changes:
        return ApplyResult(plan)
    minted = _Applier(actor, plan).run()
    logger.info(
        "policy_applied actor=%s changes=%s minted_keys=%s",
        actor.username,
        len(plan.changes),
        len(minted),
    )
    return ApplyResult(plan, minted)


def _model_fields(record: Record, model: Callable[[str], Model]) -> dict[str, Any]:
    """A model record's ``lifecycle.*`` as the model's fields: the successor as its row, the
    sunset as a moment."""
    fields: dict[str, Any] = {}
    for name, value in record.items():
        field_name = name.removeprefix("lifecycle.")
        if field_name == "successor":
            value = model(value) if value else None
        elif field_name == "sunset_at":
            value = price_moment(value) if value else None
        fields[field_name] = value
    return fields


def _named(routing: Mapping[str, Any]) -> set[str]:
    """The versions a routing names (in its split or as an alias's target)."""
    return set(routing.get("split", {})) | set(routing.get("aliases", {}).values())


def _restricted(routing: Mapping[str, Any], versions: set[str]) -> dict[str, Any]:
    """``routing`` without what it says of versions other than ``versions``."""
    split = {v: w for v, w in routing.get("split", {}).items() if v in versions}
    aliases = {a: v for a, v in routing.get("aliases", {}).items() if v in versions}
    kept: dict[str, Any] = {"split": split} if sum(split.values()) > 0 else {}
    if "sticky" in routing:
        kept["sticky"] = routing["sticky"]
    return {**kept, **({"aliases": aliases} if aliases else {})}


def _deployment_order(change: Change) -> tuple[int, Key]:
    """Deployments switched off first, then the changed ones, then the new ones: a model's
    deployments move from unlabelled to labelled (or back) without a moment where its active
    ones are both, which the deployments' rule refuses."""
    if change.action is Action.UPDATE and change.changed().get("active") is False:
        return 0, change.key
    return (1 if change.action is Action.UPDATE else 2), change.key


def _successors_first(changes: Sequence[Change]) -> list[Change]:
    """Models created or changed in an order where every successor is in place (and still
    not retired) before a model names it: by how far each is from the end of its chain."""
    successor = {
        change.key[0]: (change.after or {}).get("lifecycle.successor") for change in changes
    }

    def hops(public_id: str) -> int:
        seen: set[str] = set()
        while (after := successor.get(public_id)) and public_id not in seen:
            seen.add(public_id)
            public_id = after
        return len(seen)

    return sorted(changes, key=lambda change: hops(change.key[0]))
