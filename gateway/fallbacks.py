"""Fallbacks and degradation by class (issue 27; docs/models.md, "Fallbacks").

A use case may name, per model, an ordered list of fallback models it may also call. A
request moves to the next one when its model would refuse it for capacity, before any byte
reached the client: the queue is full, the queue timeout passed, the pool stayed saturated past
the class's ``degrade_after_s`` (dev and batch classes move to the smaller model first, so prod
keeps the large one), the replica answered 5xx, or the prompt is longer than the model's
context. The attempt that failed is refunded; the fallback is admitted afresh (its own rate
limits and queue), and the answer names what served (``x-switchyard-served-model``), as do
records, usage and metrics.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import orjson

from gateway.call import Call
from gateway.errors import GatewayError
from gateway.front_door import (
    CAPABILITY,
    FrontDoor,
    decided,
    plan_ticket,
    rebuilt_body,
    resolve_model,
)
from gateway.metrics import Decision
from gateway.policy import Policy
from gateway.scheduling import Ticket

logger = logging.getLogger("gateway.fallbacks")

#: what vLLM says when a prompt does not fit the model's context (and the simulator after it)
_CONTEXT_MESSAGES = (b"maximum context length", b"maximum model length")
#: the most of a 400's body read to tell a context refusal from another one
MAX_ERROR_BYTES = 16_384


class FallBack(Exception):
    """The model refused ``call`` for capacity before any byte reached the client: ``error``
    is what the client gets if no fallback can serve it."""

    def __init__(
        self, reason: str, error: GatewayError, decision: tuple[Decision, int] | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error
        # The admission decision (and its Retry-After) the refusal is, should no fallback
        # take the request: a queue's refusal is recorded as it is without fallbacks.
        self.decision = decision


def chain_for(policy: Policy, call: Call) -> tuple[str, ...]:
    """The fallbacks of the use case for the model the request named (JSON bodies only: an
    upload is not re-sent)."""
    chains = policy.fallbacks.get(call.principal.use_case_id)
    if chains is None or call.document is None:
        return ()
    return chains.get(call.model.base, ())


def waiting_ticket(policy: Policy, call: Call, ticket: Ticket) -> Ticket:
    """With a fallback left, the class waits on a saturated model only its
    ``degrade_after_s``, not its whole queue timeout."""
    if not call.fallbacks:
        return ticket
    klass = policy.priority_classes.get(ticket.priority_class)
    wait = klass.degrade_after_s if klass is not None else None
    if wait is None or wait >= ticket.queue_timeout_s:
        return ticket
    # A ticket changed otherwise than by its limits drops its plan (tickets.py).
    return replace(ticket, queue_timeout_s=max(wait, 0.001), plan=None)


def context_too_long(body: bytes) -> GatewayError | None:
    """A 400 from vLLM that says the prompt does not fit the model's context, as the error
    the client gets if no fallback takes the request; None for any other 400."""
    if not any(message in body for message in _CONTEXT_MESSAGES):
        return None
    try:
        message = orjson.loads(body)["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = None
    return GatewayError(
        400,
        message if isinstance(message, str) and message else "The prompt is too long.",
        code="context_length_exceeded",
        param="messages",
    )


def fall_back(door: FrontDoor, call: Call, policy: Policy, refused: FallBack) -> bool:
    """Move ``call`` to its next fallback that can serve it (still granted, offering the
    endpoint); False when none is left. The request is planned afresh on it."""
    while call.fallbacks:
        name, call.fallbacks = call.fallbacks[0], call.fallbacks[1:]
        try:
            model = resolve_model(policy, call.principal, name, CAPABILITY[call.path])
        except GatewayError as exc:
            logger.warning("fallback_skipped model=%s fallback=%s error=%s", call.model.public_id,
                           name, exc.code)  # fmt: skip
            continue
        primary = call.model.public_id
        door.metrics.fell_back(model=primary, fallback=model.public_id, reason=refused.reason)
        # In the decisions stream under the model that refused: the live fleet view's
        # fallbacks per second, and the admission decisions page's row.
        decided(door, call, "fallback", f"{refused.reason}:{model.public_id}")
        logger.info("fell_back model=%s fallback=%s reason=%s", primary, model.public_id,
                    refused.reason)  # fmt: skip
        call.model = replace(
            model, notices=(*model.notices, (b"x-switchyard-served-model", model.base.encode()))
        )
        assert call.document is not None
        call.body = rebuilt_body(call, call.document)
        call.rename_per_replica = bool(model.served_names)
        call.grant = None
        call.forwarded = False
        plan_ticket(door, call, policy)
        return True
    return False
