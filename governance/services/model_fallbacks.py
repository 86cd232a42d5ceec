"""A use case's fallback chains against its models (docs/models.md, "Fallbacks").

``UseCase.clean`` checks what one row can (the models exist, no loops or repeats); whether
each model of a chain is one the use case may call needs its models, which a request may set
in the same write. So the services ask here once the models are set, inside the write's
transaction: chains the write set must hold only the use case's models (else the whole write
is refused, naming the model); chains it left alone lose the models it took away, so that
taking a model off a use case never leaves it unable to save.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.core.exceptions import ValidationError

from governance.models import UseCase


def outside_models(chains: Mapping[str, list[str]], allowed: set[str]) -> str | None:
    """What is wrong with ``chains`` for a use case whose models are ``allowed``, if anything."""
    for model, chain in chains.items():
        outside = [name for name in (model, *chain) if name not in allowed]
        if outside:
            return f"'{outside[0]}' is not one of the use case's models."
    return None


def fallbacks_settle(use_case: UseCase, *, chains_changed: bool) -> None:
    chains: dict[str, list[str]] = dict(use_case.model_fallbacks or {})
    if not chains:
        return
    allowed = set(use_case.allowed_models.values_list("public_id", flat=True))
    if chains_changed:
        problem = outside_models(chains, allowed)
        if problem is not None:
            raise ValidationError({"model_fallbacks": problem})
        return
    kept = {
        model: [name for name in chain if name in allowed]
        for model, chain in chains.items()
        if model in allowed
    }
    kept = {model: chain for model, chain in kept.items() if chain}
    if kept != chains:
        use_case.model_fallbacks = kept
        use_case.save(update_fields=["model_fallbacks"])
