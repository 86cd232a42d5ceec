"""Settings every fleet-run guardrail shares (the model it asks, how long it may take, the
priority its calls queue at), validated the same way, and the request's texts by role.

Fleet-run guardrails are not detectors in the worker processes: the gateway asks a model on
the fleet and awaits it (gateway/guardrails/fleet.py). Their settings are still validated here,
by the catalogue, when governance saves a selection.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from guardrails import texts
from guardrails.base import SettingsError

MAX_MODEL_CHARS = 200
DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 60.0
#: the guard calls sit on the request path: they queue ahead of standard traffic by default
DEFAULT_PRIORITY_CLASS = "high"
_PRIORITY_CLASS = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
COMMON = frozenset({"model", "timeout_s", "priority_class"})


def common(settings: Mapping[str, Any], known: frozenset[str]) -> dict[str, Any]:
    """``model``, ``timeout_s`` and ``priority_class`` checked and completed; any key outside
    ``known | COMMON`` refused, so a misspelt setting is not silently ignored."""
    if not isinstance(settings, Mapping):
        raise SettingsError("Settings must be an object.")
    for key in settings:
        if key not in known | COMMON:
            allowed = ", ".join(sorted(known | COMMON))
            raise SettingsError(f"Unknown setting '{key}'; allowed: {allowed}.")
    model = settings.get("model")
    if not isinstance(model, str) or not model.strip():
        raise SettingsError("'model' is required: the public id of a model the fleet serves.")
    if len(model) > MAX_MODEL_CHARS:
        raise SettingsError(f"'model' must be at most {MAX_MODEL_CHARS} characters.")
    timeout = number(settings, "timeout_s", DEFAULT_TIMEOUT_S, low=0.0, high=MAX_TIMEOUT_S)
    if timeout <= 0:
        raise SettingsError(f"'timeout_s' must be more than 0 and at most {MAX_TIMEOUT_S:g}.")
    priority = settings.get("priority_class", DEFAULT_PRIORITY_CLASS)
    if not isinstance(priority, str) or not _PRIORITY_CLASS.match(priority):
        raise SettingsError("'priority_class' must name a priority class, e.g. 'high'.")
    return {"model": model.strip(), "timeout_s": timeout, "priority_class": priority}


def number(
    settings: Mapping[str, Any], key: str, default: float, *, low: float, high: float
) -> float:
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SettingsError(f"'{key}' must be a number between {low:g} and {high:g}.")
    if not low <= value <= high:
        raise SettingsError(f"'{key}' must be between {low:g} and {high:g}, not {value:g}.")
    return float(value)


def integer(settings: Mapping[str, Any], key: str, default: int, *, low: int, high: int) -> int:
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SettingsError(f"'{key}' must be a whole number between {low} and {high}.")
    return int(value)


def message_parts(document: object) -> Iterator[tuple[str, str]]:
    """(role, text) for each text a chat request carries, in the order the gateway hands
    guardrails their texts: the one reading of guardrails/texts.py (content strings and
    text parts, refusals, tool messages, tool-call arguments)."""
    if not isinstance(document, Mapping):
        return
    for container, key, role in texts.request_slots("/v1/chat/completions", document, strict=False):
        yield role, container[key]
