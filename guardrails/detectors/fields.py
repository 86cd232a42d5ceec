"""Reading a selection's settings: each helper checks one field and names it in its error.

Governance shows these messages to the officer who saved the selection, so they say which
field is wrong and what would be right. Every detector starts with ``only`` so a misspelt
setting ("treshold") is an error, not a silently ignored key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from guardrails.base import SettingsError


def only(guardrail: str, settings: Mapping[str, Any], known: Sequence[str]) -> None:
    """Refuse settings this guardrail does not have."""
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise SettingsError(
            f"{guardrail}: unknown setting {', '.join(repr(u) for u in unknown)}; "
            f"known: {', '.join(known)}."
        )


def number(
    settings: Mapping[str, Any],
    field: str,
    default: float,
    *,
    low: float = 0.0,
    high: float = 1.0,
) -> float:
    """A float in [low, high]; booleans are not numbers here (JSON ``true`` is no threshold)."""
    value = settings.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise SettingsError(f"'{field}' must be a number between {low:g} and {high:g}.")
    if not low <= value <= high:
        raise SettingsError(f"'{field}' must be between {low:g} and {high:g}, not {value:g}.")
    return float(value)


def integer(settings: Mapping[str, Any], field: str, default: int, *, low: int, high: int) -> int:
    value = settings.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(f"'{field}' must be a whole number between {low} and {high}.")
    if not low <= value <= high:
        raise SettingsError(f"'{field}' must be between {low} and {high}, not {value}.")
    return int(value)


def flag(settings: Mapping[str, Any], field: str, default: bool) -> bool:
    value = settings.get(field, default)
    if not isinstance(value, bool):
        raise SettingsError(f"'{field}' must be true or false.")
    return value


def strings(
    settings: Mapping[str, Any],
    field: str,
    default: Sequence[str],
    *,
    max_items: int,
    max_length: int = 200,
    allow_empty: bool = True,
) -> list[str]:
    """A list of non-blank strings, duplicates dropped, order kept."""
    value = settings.get(field, list(default))
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise SettingsError(f"'{field}' must be a list of strings.")
    if not value and not allow_empty:
        raise SettingsError(f"'{field}' must name at least one item.")
    if len(value) > max_items:
        raise SettingsError(f"'{field}' may hold at most {max_items} items, not {len(value)}.")
    for item in value:
        if not item.strip():
            raise SettingsError(f"'{field}' must not contain blank strings.")
        if len(item) > max_length:
            raise SettingsError(
                f"'{field}': each item may be at most {max_length} characters "
                f"('{item[:20]}…' has {len(item)})."
            )
    return list(dict.fromkeys(value))


def choices(
    settings: Mapping[str, Any],
    field: str,
    default: Sequence[str],
    allowed: Sequence[str],
    *,
    allow_empty: bool = False,
    normalise: bool = False,
) -> list[str]:
    """A list drawn from ``allowed`` (``normalise``: compared case-insensitively and returned
    in the catalogue's spelling)."""
    values = strings(
        settings, field, default, max_items=len(allowed), max_length=100, allow_empty=allow_empty
    )
    spelling = {a.lower() if normalise else a: a for a in allowed}
    unknown = [v for v in values if (v.lower() if normalise else v) not in spelling]
    if unknown:
        raise SettingsError(
            f"'{field}': unknown {', '.join(repr(u) for u in unknown)}; "
            f"choose from {', '.join(allowed)}."
        )
    return list(dict.fromkeys(spelling[v.lower() if normalise else v] for v in values))
