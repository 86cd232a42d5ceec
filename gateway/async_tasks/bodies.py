"""An async submit's body, read into the tasks it asks for: one JSON object, or an array of
them (a bulk submit). Pure: no I/O, so a bad body is refused before anything is counted.

Each body is the synchronous endpoint's, checked as the synchronous path checks it
(gateway/front_door.py ``validate_request``, ``resolve_model``), plus two optional fields of the
async API that are taken out before the body is queued: ``deadline`` and ``callback_url``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import orjson

from gateway import errors
from gateway.costs import Estimate, estimate_json_request
from gateway.errors import GatewayError
from gateway.front_door import resolve_model, validate_request
from gateway.policy import Model, Policy, Principal

# Which capability each async endpoint's model needs: the synchronous endpoint's.
CAPABILITY = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}
MAX_CALLBACK_URL_CHARS = 2048
# 9999-12-31T23:59:59Z: what ISO 8601 can write; a larger number is no time either.
_LATEST_DEADLINE_S = 253_402_300_799


@dataclass(slots=True)
class TaskBody:
    """One task as it will be queued: the body less the async fields, and what admission
    and the batcher need about it."""

    document: dict[str, Any]
    body: bytes  # the JSON queued (the request guardrails may rewrite it)
    model: Model
    estimate: Estimate  # as the synchronous path's admission estimates it
    deadline_ms: int  # 0: none
    callback_url: str  # "": none


def parse_submission(body: bytes, *, max_bulk: int) -> tuple[list[dict[str, Any]], bool]:
    """The bodies of a submit and whether it was a bulk one (a JSON array)."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise errors.bad_request(f"The request body is not valid JSON: {exc}") from None
    if isinstance(document, dict):
        return [document], False
    if not isinstance(document, list):
        raise errors.bad_request(
            "The request body must be a JSON object, or an array of them (a bulk submit)."
        )
    if not document:
        raise errors.bad_request("A bulk submit must hold at least one body.")
    if len(document) > max_bulk:
        raise errors.bad_request(
            f"A bulk submit holds at most {max_bulk} bodies, not {len(document)}.",
            code="too_many_tasks",
        )
    return document, True


def read_task(
    path: str,
    document: object,
    raw: bytes | None,
    policy: Policy,
    principal: Principal,
    now_s: float,
) -> TaskBody:
    """One body checked as the synchronous ``path`` checks it; ``raw`` is its bytes when the
    whole request was this one object (then it is queued as sent, not serialised again)."""
    if not isinstance(document, dict):
        raise errors.bad_request("Each body of a bulk submit must be a JSON object.")
    validate_request(path, document)
    if document.get("stream") is True:
        raise errors.bad_request(
            "Async tasks are not streamed: leave 'stream' out (or false) and poll the task.",
            param="stream",
        )
    model = resolve_model(policy, principal, document.get("model"), CAPABILITY[path])
    deadline_ms = 0
    callback_url = ""
    if "deadline" in document or "callback_url" in document:
        deadline_ms = parse_deadline(document.pop("deadline", None), now_s)
        callback_url = parse_callback_url(document.pop("callback_url", None), policy, principal)
        raw = None
    if raw is None:
        raw = orjson.dumps(document)
    estimate = estimate_json_request(path, document, len(raw), model.max_tokens)
    return TaskBody(document, raw, model, estimate, deadline_ms, callback_url)


def parse_deadline(value: object, now_s: float) -> int:
    """``deadline``: epoch seconds or an ISO 8601 time (UTC unless it says otherwise), in the
    future; as epoch milliseconds (0 for none)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        seconds = math.nan
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            seconds = math.nan
        else:
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            seconds = moment.timestamp()
    else:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds > _LATEST_DEADLINE_S:
        raise errors.bad_request(
            "'deadline' must be a time: epoch seconds or ISO 8601 (e.g. 2026-01-31T20:00:00Z).",
            param="deadline",
            code="invalid_deadline",
        )
    if seconds <= now_s:
        raise errors.bad_request(
            "'deadline' is in the past: the task could never run.",
            param="deadline",
            code="invalid_deadline",
        )
    return math.ceil(seconds * 1000)


def parse_callback_url(value: object, policy: Policy, principal: Principal) -> str:
    """``callback_url``: an http(s) URL, allowed only to a use case that can sign its calls
    (a webhook secret registered): an unsigned callback could be forged by anyone."""
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > MAX_CALLBACK_URL_CHARS:
        raise errors.bad_request(
            f"'callback_url' must be an http or https URL of at most {MAX_CALLBACK_URL_CHARS} "
            "characters.",
            param="callback_url",
        )
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise errors.bad_request(
            "'callback_url' must be an http or https URL with a host.", param="callback_url"
        )
    use_case = policy.use_cases.get(principal.use_case_id)
    if use_case is None or not use_case.async_signed_callbacks:
        raise errors.bad_request(
            f"Use case '{principal.use_case}' has no webhook signing secret: register a "
            "webhook for it first (callbacks are always signed).",
            param="callback_url",
            code="callback_not_allowed",
        )
    return value


def at_index(error: GatewayError, index: int) -> GatewayError:
    """A bulk body's refusal, naming which body (from 0) it was; the status stays."""
    param = f"[{index}]" if error.param is None else f"[{index}].{error.param}"
    return GatewayError(
        error.status,
        f"Body {index} of the bulk submit: {error.message} Nothing was queued.",
        type=error.type,
        code=error.code,
        param=param,
        headers=error.headers,
    )
