"""What makes a use case's guardrail selection valid, and the catalogue as governance shows it.

The catalogue (``guardrails.catalogue``) knows the detectors: their stages, whether they can
redact, their settings. It does not know the database, so the one rule that needs it lives
here: a guardrail the fleet runs (a guard model, an embedding model) names a registered model
with the capability it needs. Every door (services, API, admin, policy as code) validates
through ``selection_validate``, so a selection that reaches the snapshot is one the gateway
can run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from governance.choices import Capability, GuardrailAction, GuardrailSide
from governance.errors import Conflict
from governance.models import GuardrailSelection, Model, PriorityClass, UseCase
from guardrails.base import SettingsError
from guardrails.catalogue import Entry, entries, validate_selection

# The capability the model named in a fleet-run guardrail's ``config.model`` must have.
FLEET_MODEL_CAPABILITY: Mapping[str, str] = {
    "banned_topics": Capability.GUARD,
    "groundedness": Capability.EMBEDDINGS,
}


@dataclass(frozen=True, slots=True)
class CatalogueItem:
    """One catalogue entry as officers read it (API, portal, admin help)."""

    name: str
    label: str
    stages: tuple[str, ...]
    modes: tuple[str, ...]
    runs_on: str
    description: str
    model_capability: str | None


def _modes(entry: Entry) -> tuple[str, ...]:
    return tuple(a for a in GuardrailAction.values if a != "redact" or entry.redacts)


def catalogue_items() -> list[CatalogueItem]:
    return [
        CatalogueItem(
            name=entry.name,
            label=entry.label,
            stages=tuple(s for s in ("request", "response") if s in entry.stages),
            modes=_modes(entry),
            runs_on=entry.runs_on,
            description=entry.description,
            model_capability=(
                FLEET_MODEL_CAPABILITY.get(entry.name, Capability.GUARD)
                if entry.runs_on == "fleet"
                else None
            ),
        )
        for entry in sorted(entries().values(), key=lambda e: e.name)
    ]


def _stages(side: str) -> set[str]:
    return {"request", "response"} if side == GuardrailSide.BOTH else {side}


def _check_fleet_model(entry: Entry, config: Mapping[str, Any]) -> None:
    if entry.runs_on != "fleet":
        return
    capability = FLEET_MODEL_CAPABILITY.get(entry.name, Capability.GUARD)
    public_id = config.get("model")
    if not isinstance(public_id, str) or not public_id:
        raise ValidationError(
            {"config": f"model: name the {capability} model that runs '{entry.name}'."}
        )
    model = Model.objects.filter(public_id=public_id).first()
    if model is None:
        raise ValidationError({"config": f"model: no registered model is called '{public_id}'."})
    if capability not in model.capabilities:
        raise ValidationError(
            {
                "config": f"model: '{public_id}' lacks the '{capability}' capability that "
                f"'{entry.name}' needs (it has {', '.join(model.capabilities)})."
            }
        )
    priority = config.get("priority_class")
    if isinstance(priority, str) and not PriorityClass.objects.filter(name=priority).exists():
        raise ValidationError(
            {"config": f"priority_class: no priority class is called '{priority}'."}
        )


def _check_overlap(use_case: UseCase, guardrail: str, side: str, exclude_pk: int | None) -> None:
    """The same guardrail twice on one stage would run twice with two answers: refuse it."""
    others = GuardrailSelection.objects.filter(use_case=use_case, guardrail=guardrail)
    if exclude_pk is not None:
        others = others.exclude(pk=exclude_pk)
    for other in others:
        if _stages(other.side) & _stages(side):
            raise ValidationError(
                {
                    "guardrail": f"'{guardrail}' is already selected on {other.side} for this "
                    "use case; change that selection instead."
                }
            )


def selection_validate(
    *,
    use_case: UseCase,
    guardrail: str,
    side: str,
    action: str,
    config: Any,
    exclude_pk: int | None = None,
) -> dict[str, Any]:
    """The selection's complete settings (defaults filled in), or a ``ValidationError`` whose
    key names the field that is wrong (guardrail, side, action or config)."""
    entry = entries().get(guardrail)
    if entry is None:
        known = ", ".join(sorted(entries()))
        raise ValidationError({"guardrail": f"Unknown guardrail '{guardrail}'; known: {known}."})
    if side not in GuardrailSide.values:
        raise ValidationError({"side": f"Choose one of {', '.join(GuardrailSide.values)}."})
    if not _stages(side) <= set(entry.stages):
        only = " and ".join(sorted(entry.stages))
        raise ValidationError({"side": f"Guardrail '{guardrail}' runs on {only} only."})
    if action not in GuardrailAction.values:
        raise ValidationError({"action": f"Choose one of {', '.join(GuardrailAction.values)}."})
    if action == GuardrailAction.REDACT and not entry.redacts:
        raise ValidationError(
            {"action": f"Guardrail '{guardrail}' cannot redact; choose block or flag."}
        )
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ValidationError({"config": "Give a JSON object."})
    _check_fleet_model(entry, config)
    _check_overlap(use_case, guardrail, side, exclude_pk)
    try:
        return validate_selection(guardrail, side, action, config)
    except SettingsError as exc:
        raise ValidationError({"config": str(exc)}) from None
    except (TypeError, ValueError, KeyError) as exc:
        # A detector that trips over a value it did not expect: still the settings' fault.
        raise ValidationError({"config": f"Settings this guardrail cannot use ({exc})."}) from None
    except (ImportError, AttributeError) as exc:
        # A company detector's package missing on this server: say so, do not store a
        # selection no gateway could run.
        raise ValidationError(
            {
                "guardrail": f"Guardrail '{guardrail}' cannot be loaded on this server "
                f"({exc.__class__.__name__}: {exc})."
            }
        ) from None


def selections_naming_model(public_id: str) -> QuerySet[GuardrailSelection]:
    """The fleet-run selections whose ``config.model`` is this model."""
    fleet = [name for name, entry in entries().items() if entry.runs_on == "fleet"]
    return GuardrailSelection.objects.filter(
        guardrail__in=fleet, config__model=public_id
    ).select_related("use_case__tenant")


def model_change_check(model: Model, *, deleting: bool) -> None:
    """A model a guardrail asks for verdicts stays, keeps its name and the capability the
    guardrail needs; otherwise the gateway would hold a selection it cannot run."""
    stored = Model.objects.filter(pk=model.pk).first()
    if stored is None:
        return
    users = list(selections_naming_model(stored.public_id))
    if not users:
        return
    named = ", ".join(sorted(f"{s.use_case} ({s.guardrail})" for s in users))
    if deleting:
        raise Conflict(
            f"Guardrails still ask model '{stored.public_id}': {named}. Change them first."
        )
    if model.public_id != stored.public_id:
        raise ValidationError(
            {"public_id": f"Guardrails ask this model by its name: {named}; change them first."}
        )
    for selection in users:
        needed = FLEET_MODEL_CAPABILITY.get(selection.guardrail, Capability.GUARD)
        if needed not in (model.capabilities or []):
            raise ValidationError(
                {"capabilities": f"'{needed}' is needed by the guardrails of {named}."}
            )
