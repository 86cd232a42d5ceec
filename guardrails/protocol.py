"""What the gateway and the guardrail service say to each other: one JSON request, one answer.

``POST /v1/check`` with ``{"stage": "request"|"response", "texts": [str, …], "checks":
[{"guardrail": name, "action": "block"|"redact"|"flag", "settings": {…}}, …]}`` answers 200
with the engine's ``Outcome.as_json()`` (``texts``, ``findings``, ``blocked``). Failures are
``{"error": {"message", "code"}}``: 400 ``invalid_check`` (the request is wrong: fix it, do not
retry), 503 ``guardrail_busy`` / 504 ``guardrail_timeout`` / 500 ``guardrail_failed`` (the
check could not run: the caller applies its use case's failure mode).

``POST /v1/check/bulk`` with ``{"stage", "bodies": [[str, …], …], "checks"}``: the same checks
on each of many requests' texts (an async bulk submit's bodies), each checked exactly as its
own ``/v1/check`` would be and the text budget applying to each; 200 with ``{"results": […]}``,
one per body in order: its ``Outcome.as_json()`` or its ``{"error": {"message", "code"}}``.
One request for all of them, so the service shares them out over its workers in a few jobs
(guardrails/batching.py) instead of one round trip and one job a body.

Cheap to import: the gateway builds requests with it, the service validates them with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

import orjson

from guardrails.catalogue import ACTIONS, STAGES, entries

CHECK_PATH: Final = "/v1/check"
CHECK_BULK_PATH: Final = "/v1/check/bulk"
HEALTH_PATH: Final = "/healthz"
METRICS_PATH: Final = "/metrics"
# The characters one check may carry (all its texts together), for the gateway and the service
# alike: a detector's time grows with the text, and a check past the service's timeout kills
# and reloads a worker, so a request over the budget is refused before it is sent.
MAX_TEXT_CHARS_ENV: Final = "SWITCHYARD_GUARDRAIL_MAX_TEXT_CHARS"
DEFAULT_MAX_TEXT_CHARS: Final = 50_000
# The shared secret the gateway presents (``Authorization: Bearer …``) and the service checks.
TOKEN_ENV: Final = "SWITCHYARD_GUARDRAIL_TOKEN"  # noqa: S105 (a variable's name)


def text_chars(texts: Sequence[str]) -> int:
    return sum(len(text) for text in texts)


def over_budget_message(chars: int, budget: int) -> str:
    return (
        f"The text to check ({chars:,} characters) is over the guardrail budget of "
        f"{budget:,} characters for one request: send less text, or ask the platform team "
        f"to raise {MAX_TEXT_CHARS_ENV}."
    )


class InvalidCheck(ValueError):
    """A check request the service cannot run as given; the message names the field."""


@dataclass(frozen=True, slots=True)
class CheckSpec:
    guardrail: str
    action: str
    settings: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"guardrail": self.guardrail, "action": self.action, "settings": self.settings}


@dataclass(frozen=True, slots=True)
class CheckRequest:
    stage: str
    texts: list[str]
    checks: list[CheckSpec]


def encode_request(stage: str, texts: Sequence[str], checks: Sequence[CheckSpec]) -> bytes:
    return orjson.dumps(
        {"stage": stage, "texts": list(texts), "checks": [check.as_json() for check in checks]}
    )


@dataclass(frozen=True, slots=True)
class BulkCheckRequest:
    stage: str
    bodies: list[list[str]]
    checks: list[CheckSpec]


def encode_bulk_request(
    stage: str, bodies: Sequence[Sequence[str]], checks: Sequence[CheckSpec]
) -> bytes:
    return orjson.dumps(
        {
            "stage": stage,
            "bodies": [list(texts) for texts in bodies],
            "checks": [check.as_json() for check in checks],
        }
    )


class OverBudget(InvalidCheck):
    """The texts are over the service's character budget."""


def parse_request(raw: bytes, *, max_text_chars: int | None = None) -> CheckRequest:
    """A validated check request, or ``InvalidCheck`` naming what is wrong.

    Settings are taken as governance validated them when the selection was saved: checking
    them again on every call would cost each request a detector's ``validate``."""
    document = _object(raw)
    stage = _stage(document)
    texts = document.get("texts")
    if not _strings(texts):
        raise InvalidCheck("'texts' must be an array of strings.")
    _within_budget(texts, max_text_chars)
    return CheckRequest(stage=stage, texts=texts, checks=_checks(document, stage))


def parse_bulk_request(raw: bytes, *, max_text_chars: int | None = None) -> BulkCheckRequest:
    """``parse_request`` for ``/v1/check/bulk``: the budget is each body's."""
    document = _object(raw)
    stage = _stage(document)
    bodies = document.get("bodies")
    if not isinstance(bodies, list) or not bodies or not all(map(_strings, bodies)):
        raise InvalidCheck("'bodies' must be a non-empty array of arrays of strings.")
    for texts in bodies:
        _within_budget(texts, max_text_chars)
    return BulkCheckRequest(stage=stage, bodies=bodies, checks=_checks(document, stage))


def _object(raw: bytes) -> dict[str, Any]:
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidCheck(f"The body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidCheck("The body must be a JSON object.")
    return document


def _stage(document: dict[str, Any]) -> str:
    stage = document.get("stage")
    if stage not in STAGES:
        raise InvalidCheck(f"'stage' must be one of {', '.join(STAGES)}.")
    return str(stage)


def _strings(texts: object) -> TypeGuard[list[str]]:
    return isinstance(texts, list) and all(isinstance(text, str) for text in texts)


def _within_budget(texts: list[str], max_text_chars: int | None) -> None:
    if max_text_chars is not None and (chars := text_chars(texts)) > max_text_chars:
        raise OverBudget(over_budget_message(chars, max_text_chars))


def _checks(document: dict[str, Any], stage: str) -> list[CheckSpec]:
    raw_checks = document.get("checks")
    if not isinstance(raw_checks, list) or not raw_checks:
        raise InvalidCheck("'checks' must be a non-empty array.")
    catalogue = entries()
    checks = []
    for index, item in enumerate(raw_checks):
        where = f"checks[{index}]"
        if not isinstance(item, dict):
            raise InvalidCheck(f"'{where}' must be an object.")
        name, action, settings = item.get("guardrail"), item.get("action"), item.get("settings")
        entry = catalogue.get(name) if isinstance(name, str) else None
        if entry is None:
            raise InvalidCheck(f"'{where}.guardrail': unknown guardrail {name!r}.")
        if entry.runs_on != "worker":
            raise InvalidCheck(
                f"'{where}.guardrail': {name!r} runs on the fleet, not in guardrail workers."
            )
        if stage not in entry.stages:
            raise InvalidCheck(f"'{where}': {name!r} does not run on the {stage} stage.")
        if action not in ACTIONS or (action == "redact" and not entry.redacts):
            allowed = [a for a in ACTIONS if a != "redact" or entry.redacts]
            raise InvalidCheck(f"'{where}.action' must be one of {', '.join(allowed)}.")
        if settings is None:
            settings = {}
        if not isinstance(settings, dict):
            raise InvalidCheck(f"'{where}.settings' must be an object.")
        checks.append(CheckSpec(entry.name, action, settings))
    return checks


def error_body(message: str, code: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "code": code}})
