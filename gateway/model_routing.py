"""Which version of a model answers a request (issue 27; docs/models.md, "Versions").

A model with versions has no replicas of its own: each version is a pool, published as its
own snapshot entry ``<model>@<version>``. A request names the model (the use case's pin, or
else the split, chooses), a version (``model@v2``) or an alias (``model@stable``). One rule
for every door: the front door at admission (``resolve_model``) and the batcher when it runs
an async task, a batch line or a file job's part.
"""

from __future__ import annotations

from dataclasses import replace

from gateway import errors
from gateway.policy import Model, Policy, Routing


def named(policy: Policy, name: str) -> Model | None:
    """The model a request's ``model`` names: a public id, a version's entry
    (``model@v2``), or ``model@alias`` (the version it points at now)."""
    model = policy.models.get(name)
    if model is not None or "@" not in name:
        return model
    base, _, label = name.partition("@")
    parent = policy.models.get(base)
    routing = parent.routing if parent is not None else None
    version = routing.target(label) if routing is not None else None
    return None if version is None else policy.models.get(f"{base}@{version}")


def route(policy: Policy, model: Model, use_case_id: int) -> Model:
    """The version of ``model`` (one with ``routing``) that serves this request: the use
    case's pin, else the split, per request or sticky per use case. ``model`` may be a
    successor serving under an old id: its notices then go with the version's."""
    routing: Routing = model.routing  # type: ignore[assignment]
    version = None
    pins = policy.pins.get(use_case_id)  # only use cases with pins are there
    if pins is not None:
        pin = pins.get(model.public_id)
        version = routing.target(pin) if pin is not None else None
    if version is None:
        if routing.sticky == "use_case":
            version = routing.wheel.by_hash(f"{model.public_id}:{use_case_id}")
        else:
            version = routing.wheel.next()
    chosen = policy.models.get(routing.pools[version])
    if chosen is None:  # a snapshot that names a version without its entry: not served
        raise errors.service_unavailable(
            f"No version of model '{model.public_id}' can serve now; retry shortly.",
            code="model_unavailable",
            retry_after_s=5,
        )
    if model.notices and model.notices != chosen.notices[: len(model.notices)]:
        # A successor serving under an old id: the old id's notices, then the version.
        chosen = replace(chosen, notices=model.notices + chosen.notices[-1:])
    return chosen
