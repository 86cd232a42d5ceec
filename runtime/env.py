"""Typed environment-variable helpers that fail loudly on a bad value.

Every helper also accepts ``NAME_FILE`` (a path whose contents are the value), the convention
for secrets mounted by Kubernetes or Docker. Every variable read here is documented in the
configuration reference, docs/configuration.md.
"""

from __future__ import annotations

import os
from pathlib import Path


class ConfigurationError(ValueError):
    """A setting is present but malformed; raised at start-up, never at request time."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _raw(name: str) -> str | None:
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().strip()
        except OSError as exc:
            raise ConfigurationError(f"{name}_FILE={file_path!r} cannot be read: {exc}") from exc
    return os.environ.get(name)


def env_str(name: str, default: str) -> str:
    value = _raw(name)
    return default if value is None else value


def env_required(name: str) -> str:
    value = _raw(name)
    if not value:
        raise ConfigurationError(f"{name} must be set (or {name}_FILE pointing at a file)")
    return value


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = _raw(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError as exc:
        raise ConfigurationError(f"{name}={value!r} is not an integer") from exc
    if minimum is not None and number < minimum:
        raise ConfigurationError(f"{name}={number} must be at least {minimum}")
    return number


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = _raw(name)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError as exc:
        raise ConfigurationError(f"{name}={value!r} is not a number") from exc
    if minimum is not None and number < minimum:
        raise ConfigurationError(f"{name}={number} must be at least {minimum}")
    return number


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigurationError(f"{name}={value!r} is not a boolean (use true/false)")


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env_str(name, default)
    if value not in choices:
        raise ConfigurationError(f"{name}={value!r} must be one of {', '.join(choices)}")
    return value
