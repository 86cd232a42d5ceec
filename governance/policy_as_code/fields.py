"""Reading one mapping of a policy file field by field, and the value checks it uses.

Problems are collected, not raised, so that one pass over the file reports all of them.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator, validate_email

from governance.models import (
    application_id_validator,
    client_id_validator,
    model_id_validator,
    slug_validator,
)
from governance.policy_as_code.errors import Problem

# --- reading one mapping of the file -----------------------------------------------------
_MISSING: Final = object()


class Reader:
    """One mapping of the file read field by field; problems are collected, not raised.

    Every getter returns a usable placeholder after recording a problem, so parsing carries
    on and reports everything; a document with problems is never returned.
    """

    def __init__(
        self, raw: Mapping[Any, Any], path: str, problems: list[Problem], known: Sequence[str]
    ) -> None:
        self.raw = raw
        self.path = path
        self.problems = problems
        for key in raw:
            if key not in known:
                hint = difflib.get_close_matches(str(key), known, n=1)
                suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
                self.problem("", f"unknown field '{key}'{suggestion}")

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if key else self.path

    def problem(self, key: str, message: str) -> None:
        self.problems.append(Problem(self.at(key), message))

    def _get(self, key: str, required: bool) -> Any:
        value = self.raw.get(key, _MISSING)
        if value is _MISSING or value is None:
            if required:
                self.problem(key, "is required")
            return _MISSING
        return value

    def text(
        self,
        key: str,
        *,
        required: bool = True,
        max_length: int = 200,
        check: Callable[[str], str | None] | None = None,
    ) -> str:
        value = self._get(key, required)
        if value is _MISSING:
            return ""
        if not isinstance(value, str) or (required and not value.strip()):
            self.problem(key, "must be a non-empty string" if required else "must be a string")
            return ""
        if len(value) > max_length:
            self.problem(key, f"must be at most {max_length} characters")
        elif check is not None and (message := check(value)) is not None:
            self.problem(key, message)
        return value

    def choice(self, key: str, choices: Sequence[str], *, default: str | None = None) -> str:
        value = self._get(key, default is None)
        if value is _MISSING:
            return default or ""
        if value not in choices:
            self.problem(key, f"must be one of {', '.join(choices)} (got {value!r})")
            return default or ""
        return str(value)

    def integer(
        self, key: str, *, default: int | None, minimum: int, maximum: int | None = None
    ) -> int:
        value = self._get(key, default is None)
        if value is _MISSING:
            return default or 0
        return self._check_int(key, value, minimum, maximum)

    def optional_positive(self, key: str) -> int | None:
        value = self._get(key, required=False)
        if value is _MISSING:
            return None
        return self._check_int(key, value, 1, None)

    def _check_int(self, key: str, value: Any, minimum: int, maximum: int | None) -> int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
        if ok and maximum is not None and value > maximum:
            ok = False
        if not ok:
            if minimum == 1 and maximum is None:
                self.problem(key, "must be a positive integer")
            elif maximum is None:
                self.problem(key, f"must be an integer of at least {minimum}")
            else:
                self.problem(key, f"must be an integer from {minimum} to {maximum}")
            return minimum
        return int(value)

    def number(
        self, key: str, *, default: float, minimum: float, unit: str, maximum: float | None = None
    ) -> float:
        value = self._get(key, required=False)
        if value is _MISSING:
            return default
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < minimum
            or (maximum is not None and value > maximum)
        ):
            if maximum is None:
                self.problem(key, f"must be a number of {unit}, at least {minimum:g}")
            else:
                self.problem(key, f"must be a {unit} from {minimum:g} to {maximum:g}")
            return default
        return float(value)

    def boolean(self, key: str, *, default: bool) -> bool:
        value = self._get(key, required=False)
        if value is _MISSING:
            return default
        if not isinstance(value, bool):
            self.problem(key, "must be true or false")
            return default
        return value

    def texts(
        self,
        key: str,
        *,
        required: bool = False,
        allowed: Sequence[str] | None = None,
        check: Callable[[str], str | None] | None = None,
    ) -> tuple[str, ...]:
        value = self._get(key, required)
        if value is _MISSING:
            return ()
        if not isinstance(value, list):
            self.problem(key, "must be a list")
            return ()
        items: list[str] = []
        for index, item in enumerate(value):
            where = f"{key}[{index}]"
            if not isinstance(item, str) or not item:
                self.problem(where, "must be a non-empty string")
            elif allowed is not None and item not in allowed:
                self.problem(where, f"must be one of {', '.join(allowed)} (got {item!r})")
            elif check is not None and (message := check(item)) is not None:
                self.problem(where, message)
            elif item in items:
                self.problem(where, f"{item!r} is listed twice")
            else:
                items.append(item)
        if required and not value:
            self.problem(key, "must list at least one entry")
        return tuple(items)

    def mapping(self, key: str) -> Mapping[Any, Any] | None:
        value = self._get(key, required=False)
        if value is _MISSING:
            return None
        if not isinstance(value, dict):
            self.problem(key, "must be a mapping")
            return None
        return value

    def listing(self, key: str) -> list[Any]:
        value = self._get(key, required=False)
        if value is _MISSING:
            return []
        if not isinstance(value, list):
            self.problem(key, "must be a list")
            return []
        return value


# --- value checks: each returns a message, or None when the value is fine ----------------
def _django_check(validator: Callable[[str], None]) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        try:
            validator(value)
        except ValidationError as exc:
            return " ".join(exc.messages)
        return None

    return check


check_slug = _django_check(slug_validator)
check_model_id = _django_check(model_id_validator)
check_application_id = _django_check(application_id_validator)
check_client_id = _django_check(client_id_validator)
check_email = _django_check(validate_email)
check_url = _django_check(URLValidator())


REPLICA_SCHEMES: Final = ("http", "https", "dns+http", "dns+https")


def check_replica_url(value: str) -> str | None:
    try:
        parts = urlsplit(value)
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        return f"{value!r} is not a valid URL"
    # dns+http(s)://: a headless Service's name, resolved to its pods (gateway/discovery.py).
    if parts.scheme not in REPLICA_SCHEMES or not parts.hostname or not port_ok:
        return f"{value!r} is not an http(s):// base URL with a host"
    if any(ch.isspace() for ch in value) or parts.query or parts.fragment:
        return f"{value!r} must be a plain base URL (no spaces, query or fragment)"
    return None


def is_json(value: Any) -> bool:
    if value is None or isinstance(value, str | bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(is_json(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_json(v) for k, v in value.items())
    return False
