"""Body validation that fails the way vLLM's FastAPI/pydantic layer does.

vLLM validates request bodies with pydantic in lax mode ("10" is a valid integer, 2.0 too)
and reports failures as ``N validation error(s):\\n  {'type': ..., 'loc': 'body.field',
'msg': ..., 'input': ...}`` with ``param`` set to the first error's location. This module
reproduces that for the field types the simulator reads, without pydantic's per-request
cost on the hot path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from simulator.errors import ApiError, validation_error

T = TypeVar("T")

_MAX_ERROR_INPUT_CHARS = 200
_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}


class Invalid(Exception):
    def __init__(self, kind: str, msg: str, ctx: Mapping[str, Any] | None = None) -> None:
        super().__init__(msg)
        self.kind = kind
        self.msg = msg
        self.ctx = ctx


def summarize_input(value: object) -> object:
    """vLLM bounds the echoed input: containers are described, long strings cut."""
    if isinstance(value, str):
        if len(value) > _MAX_ERROR_INPUT_CHARS:
            return value[:_MAX_ERROR_INPUT_CHARS] + "...[truncated]"
        return value
    if isinstance(value, list | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = str(value)
    if len(text) > _MAX_ERROR_INPUT_CHARS:
        return text[:_MAX_ERROR_INPUT_CHARS] + "...[truncated]"
    return text


def format_error(
    kind: str, loc: str, msg: str, value: object, ctx: Mapping[str, Any] | None = None
) -> str:
    err: dict[str, object] = {
        "type": kind,
        "loc": loc,
        "msg": msg,
        "input": summarize_input(value),
    }
    if ctx is not None:
        err["ctx"] = dict(ctx)
    return str(err)


def json_decode_error(body: bytes) -> ApiError:
    """FastAPI's report of a body that is not JSON, using the stdlib's wording and offset."""
    try:
        json.loads(body)
    except json.JSONDecodeError as exc:
        loc, ctx_error = f"body.{exc.pos}", exc.msg
    except UnicodeDecodeError as exc:
        loc, ctx_error = "body.0", str(exc)
    else:  # orjson is stricter than json (e.g. NaN); report it at the start
        loc, ctx_error = "body.0", "Invalid JSON"
    line = format_error("json_invalid", loc, "JSON decode error", {}, {"error": ctx_error})
    return validation_error(line, param=loc)


UNSUPPORTED_MEDIA_TYPE = "Unsupported Media Type: Only 'application/json' is allowed"


# -- lax coercions, pydantic's rules -------------------------------------------------------


def to_int(value: object) -> int:
    if type(value) is int:
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise Invalid(
            "int_from_float", "Input should be a valid integer, got a number with a fractional part"
        )
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise Invalid(
                "int_parsing",
                "Input should be a valid integer, unable to parse string as an integer",
            ) from None
    raise Invalid("int_type", "Input should be a valid integer")


def to_float(value: object) -> float:
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise Invalid(
                "float_parsing",
                "Input should be a valid number, unable to parse string as a number",
            ) from None
    raise Invalid("float_type", "Input should be a valid number")


def to_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise Invalid("bool_parsing", "Input should be a valid boolean, unable to interpret input")
    raise Invalid("bool_type", "Input should be a valid boolean")


def to_str(value: object) -> str:
    if isinstance(value, str):
        return value
    raise Invalid("string_type", "Input should be a valid string")


def to_list(value: object) -> list[Any]:
    if isinstance(value, list):
        return value
    raise Invalid("list_type", "Input should be a valid list")


def to_dict(value: object) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    raise Invalid("dict_type", "Input should be a valid dictionary")


class Body:
    """Reads typed fields from a JSON object, collecting every failure like pydantic does."""

    def __init__(self, data: object) -> None:
        if not isinstance(data, dict):
            # What FastAPI says when the JSON body is not an object.
            raise validation_error(
                format_error(
                    "model_attributes_type",
                    "body",
                    "Input should be a valid dictionary or object to extract fields from",
                    data,
                ),
                param="body",
            )
        self.data: dict[str, Any] = data
        self._errors: list[tuple[str, str]] = []

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def required(self, name: str, convert: Callable[[object], T]) -> T | None:
        if name not in self.data:
            self.fail("missing", name, "Field required", self.data)
            return None
        return self.get(name, convert, None)

    def get(self, name: str, convert: Callable[[object], T], default: T) -> T:
        value = self.data.get(name)
        if value is None:
            return default
        try:
            return convert(value)
        except Invalid as exc:
            self.fail(exc.kind, name, exc.msg, value, exc.ctx)
            return default

    def fail(
        self,
        kind: str,
        loc: str,
        msg: str,
        value: object,
        ctx: Mapping[str, Any] | None = None,
    ) -> None:
        path = f"body.{loc}"
        self._errors.append((path, format_error(kind, path, msg, value, ctx)))

    def check(self) -> None:
        if self._errors:
            raise validation_error(*(line for _, line in self._errors), param=self._errors[0][0])
