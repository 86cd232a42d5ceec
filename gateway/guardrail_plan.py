"""A use case's guardrails as a plan, made once when the policy snapshot is parsed.

Each use case's selections become a ``GuardPlan``: request-stage and response-stage checks,
each split into the ones the guardrail service runs and the ones a model on the fleet answers.
Only use cases with selections get one, so the request path of one without pays a single
dictionary lookup (``Policy.guarded``).

Pure: no I/O and nothing of the gateway above it, so that gateway/policy.py can build plans
without importing the clients that run them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from guardrails.catalogue import ROLES_SETTING, entries
from guardrails.engine import Check
from guardrails.grounding import needs_logprobs
from guardrails.protocol import CheckSpec

logger = logging.getLogger("gateway.guardrails")

FAILURE_MODES = ("closed", "open")
_SIDES = {"request": ("request",), "response": ("response",), "both": ("request", "response")}
_ACTIONS = frozenset({"block", "redact", "flag"})
ANSWER_ROLE = "assistant"

# How much of a streamed answer a check needs to see at once (characters): a span detector
# needs its longest entity, a classifier a sentence or two. A stream holds back the largest
# of its checks' needs (a guardrail not listed: DEFAULT_WINDOW_CHARS).
WINDOW_CHARS: Mapping[str, int] = {
    "pii": 128,
    "secrets": 256,
    "invisible_text": 16,
    "banned_substrings": 128,
    "toxicity": 256,
    "language": 256,
    "banned_topics": 512,
    "groundedness": 512,
}
DEFAULT_WINDOW_CHARS = 256


class Selection(Protocol):
    """One guardrail a use case selected, as the snapshot says (gateway/policy.py
    ``Guardrail``)."""

    @property
    def guardrail(self) -> str: ...

    @property
    def side(self) -> str: ...

    @property
    def action(self) -> str: ...

    @property
    def config(self) -> Mapping[str, object]: ...


@dataclass(frozen=True, slots=True)
class ScopedChecks:
    """Checks an officer scoped to some message roles (the ``roles`` setting): they read only
    the texts those roles said, run after the stage's other checks."""

    roles: frozenset[str]
    service: tuple[CheckSpec, ...]
    fleet: tuple[Check, ...]


@dataclass(frozen=True, slots=True)
class StageChecks:
    stage: str
    service: tuple[CheckSpec, ...]  # run by the guardrail service, in one call
    fleet: tuple[Check, ...]  # answered by a model on the fleet, one call each
    #: checks scoped to some roles, one group per scope (request stage: an answer is the
    #: assistant's, so a response check either reads it whole or is not in the stage)
    scoped: tuple[ScopedChecks, ...] = ()

    @property
    def names(self) -> list[str]:
        return (
            [c.guardrail for c in self.service]
            + [c.guardrail for c in self.fleet]
            + [c.guardrail for group in self.scoped for c in group.service]
            + [c.guardrail for group in self.scoped for c in group.fleet]
        )


@dataclass(frozen=True, slots=True)
class GuardPlan:
    request: StageChecks | None
    response: StageChecks | None
    failure: str  # "closed" | "open"
    window_chars: int  # what a stream's response checks hold back
    #: a response check reads the answer's token logprobs: the gateway asks the model for
    #: them (gateway/guardrails/fleet.py ``ask_logprobs``); no other use case pays anything
    logprobs: bool = False


def plan_guardrails(selections: Sequence[Selection], failure: str) -> GuardPlan:
    """A use case's selections split by stage and by where they run; ValueError if malformed."""
    if failure not in FAILURE_MODES:
        raise ValueError(f"guardrail_failure must be closed or open, not {failure!r}")
    try:
        catalogue = entries()
    except (ImportError, AttributeError, ValueError) as exc:
        # A bad SWITCHYARD_GUARDRAIL_DETECTORS on this host must not stop the gateway: the
        # built-in entries say which run on the fleet; the rest go to the service.
        logger.error("guardrail_catalogue_unavailable error=%r", exc)
        catalogue = {}
    # (stage, scope) → (service checks, fleet checks); scope None: every text
    staged: dict[tuple[str, frozenset[str] | None], tuple[list[CheckSpec], list[Check]]] = {}
    for selection in selections:
        stages = _SIDES.get(selection.side)
        if stages is None or selection.action not in _ACTIONS:
            raise ValueError(
                f"guardrail {selection.guardrail!r}: side {selection.side!r} / action "
                f"{selection.action!r} is not valid"
            )
        entry = catalogue.get(selection.guardrail)
        config = dict(selection.config)
        roles = config.pop(ROLES_SETTING, None)
        for stage in stages:
            scope = frozenset(str(r) for r in roles) if isinstance(roles, list) and roles else None
            if stage == "response" and scope is not None:
                if ANSWER_ROLE not in scope:
                    continue  # an answer is the assistant's: nothing here for this check
                scope = None
            service, fleet = staged.setdefault((stage, scope), ([], []))
            if entry is not None and entry.runs_on == "fleet":
                fleet.append(Check(selection.guardrail, selection.action, config))
            else:
                service.append(CheckSpec(selection.guardrail, selection.action, dict(config)))

    def stage_checks(stage: str) -> StageChecks | None:
        service, fleet = staged.get((stage, None), ([], []))
        scoped = tuple(
            ScopedChecks(scope, tuple(s), tuple(f))
            for (at, scope), (s, f) in staged.items()
            if at == stage and scope is not None
        )
        if not service and not fleet and not scoped:
            return None
        return StageChecks(stage, tuple(service), tuple(fleet), scoped)

    response = stage_checks("response")
    window = (
        max(
            (WINDOW_CHARS.get(name, DEFAULT_WINDOW_CHARS) for name in response.names),
            default=DEFAULT_WINDOW_CHARS,
        )
        if response
        else DEFAULT_WINDOW_CHARS
    )
    logprobs = response is not None and any(
        needs_logprobs(check.settings)
        for check in (*response.fleet, *(c for group in response.scoped for c in group.fleet))
    )
    return GuardPlan(stage_checks("request"), response, failure, window, logprobs)
