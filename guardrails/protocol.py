"""What the gateway and the guardrail service say to each other: one JSON request, one answer.

``POST /v1/check`` with ``{"stage": "request"|"response", "texts": [str, …], "checks":
[{"guardrail": name, "action": "block"|"redact"|"flag", "settings": {…}}, …]}`` answers 200
with the engine's ``Outcome.as_json()`` (``texts``, ``findings``, ``blocked``). Failures are
``{"error": {"message", "code"}}``: 400 ``invalid_check`` (the request is wrong: fix it, do not
retry), 503 ``guardrail_busy`` / 504 ``guardrail_timeout`` / 500 ``guardrail_failed`` (the
check could not run: the caller applies its use case's failure mode).

Cheap to import: the gateway builds requests with it, the service validates them with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from guardrails.catalogue import ACTIONS, STAGES, entries

CHECK_PATH: Final = "/v1/check"
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


class OverBudget(InvalidCheck):
    """The texts are over the service's character budget."""


def parse_request(raw: bytes, *, max_text_chars: int | None = None) -> CheckRequest:
    """A validated check request, or ``InvalidCheck`` naming what is wrong.

    Settings are taken as governance validated them when the selection was saved: checking
    them again on every call would cost each request a detector's ``validate``."""
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidCheck(f"The body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidCheck("The body must be a JSON object.")
    stage = document.get("stage")
    if stage not in STAGES:
        raise InvalidCheck(f"'stage' must be one of {', '.join(STAGES)}.")
    texts = document.get("texts")
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        raise InvalidCheck("'texts' must be an array of strings.")
    if max_text_chars is not None and (chars := text_chars(texts)) > max_text_chars:
        raise OverBudget(over_budget_message(chars, max_text_chars))
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
    return CheckRequest(stage=stage, texts=texts, checks=checks)


def error_body(message: str, code: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "code": code}})
