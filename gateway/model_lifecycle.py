"""What serves a request for a deprecated or retired model, by the gateway's own clock
(docs/models.md): the model itself with its notices before the sunset; after it the officer's
choice, a 410 naming the successor or the successor under the old id. One rule for every door:
the front door (gateway/front_door.py ``resolve_model``) at admission, and the batcher when it
runs a task that was queued before the sunset."""

from __future__ import annotations

import time
from dataclasses import replace

from gateway.errors import GatewayError
from gateway.policy import Model, Policy


def serving_model(policy: Policy, model: Model, name: str) -> Model:
    """A deprecated model before its sunset serves with its notices (``model.notices``); at or
    after it (or retired), by the gateway's own clock and not beat's, the officer's choice: a
    410 naming the successor, or the successor serving under the old id. A successor that has
    itself reached its sunset is followed in turn (governance refuses cycles; the hop bound
    guards against a snapshot that has one anyway)."""
    now = time.time()
    for _ in range(8):
        lifecycle = model.lifecycle
        if lifecycle is None or not lifecycle.ended(now):
            return model
        successor = policy.models.get(lifecycle.successor) if lifecycle.successor else None
        if lifecycle.at_sunset != "successor" or successor is None:
            raise retired_error(name, lifecycle.successor, model.notices)
        # Looked up now rather than kept at parse time: the successor's replicas are the
        # current ones (service names expanded by discovery). Only past a sunset.
        model = replace(
            successor, notices=lifecycle.successor_notices, lifecycle=successor.lifecycle
        )
    raise retired_error(name, None, ())


def retired_error(
    name: str, successor: str | None, notices: tuple[tuple[bytes, bytes], ...]
) -> GatewayError:
    instead = f" Use '{successor}' instead." if successor else ""
    return GatewayError(
        410,
        f"The model '{name}' has been retired.{instead}",
        code="model_retired",
        param="model",
        # The same notices as before the sunset: its date, and the link to the notice.
        headers=[header for header in notices if header[0] != b"x-switchyard-served-model"],
    )
