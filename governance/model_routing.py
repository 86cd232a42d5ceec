"""A model's versions, aliases and traffic split (issue 27; docs/models.md, "Versions").

A version is a label on a model's deployments: the deployments of a new checkpoint behind the
same public id carry a new label, and the gateway gives each version its own pool. Which
version answers a request is the model's ``routing``:

- ``split``: weights by version (``{"v1": 95, "v2": 5}``); a version the split leaves out
  gets no traffic. With no split, the version deployed first serves everything: a new
  checkpoint takes traffic only when an officer gives it weight.
- ``sticky``: ``request`` (each request drawn on its own, smooth weighted round robin, so
  the shares hold over any run of requests) or ``use_case`` (a use case always lands on the
  same version, drawn once by a hash of its id: the shares then hold over use cases).
- ``aliases``: names officers point at versions (``{"stable": "v1", "preview": "v2"}``).
  Clients call ``model@alias`` or ``model@version`` to pin themselves; a use case can be
  pinned by its officer (``UseCase.model_pins``).

This module owns the shape and the rules that need only the routing and the version labels;
``Model.clean`` and ``Deployment.clean`` apply them, the snapshot publishes what they passed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.core.exceptions import ValidationError

#: a version or alias label: what follows ``@`` in a model id ("@" is never in a public id)
LABEL = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}\Z")
LABEL_HELP = "lowercase letters, digits and . _ - (max 32), starting with a letter or digit"
STICKY = ("request", "use_case")
MAX_WEIGHT = 1000
MAX_ALIASES = 20
_KEYS = ("split", "sticky", "aliases")
_PINS_AT_THE_END: ContextVar[bool] = ContextVar("pins_at_the_end", default=False)


@contextmanager
def pins_checked_at_the_end() -> Iterator[None]:
    """Within it a model's routing may leave a use case's pin stale for a moment (policy as
    code moves routing and deployments in steps); the caller checks every pin at the end
    (``governance.models.stale_pins``)."""
    token = _PINS_AT_THE_END.set(True)
    try:
        yield
    finally:
        _PINS_AT_THE_END.reset(token)


def pins_at_the_end() -> bool:
    """Whether a routing change leaves the pin check to its caller (see above)."""
    return _PINS_AT_THE_END.get()


def clean_routing(value: Any, versions: Iterable[str]) -> dict[str, Any]:
    """``value`` checked against the model's version labels and returned in canonical form
    (empty members left out); ValidationError naming the member that is wrong."""
    known = set(versions)
    if value in (None, ""):
        return {}
    if not isinstance(value, Mapping):
        raise ValidationError('Give a JSON object: {"split": {...}, "aliases": {...}}.')
    unknown = sorted(set(value) - set(_KEYS))
    if unknown:
        raise ValidationError(f"Unknown member {unknown[0]!r}: use {', '.join(_KEYS)}.")
    routing: dict[str, Any] = {}
    split = value.get("split") or {}
    if not isinstance(split, Mapping):
        raise ValidationError('\'split\' maps versions to weights, e.g. {"v1": 95, "v2": 5}.')
    for version, weight in split.items():
        _known_version("split", version, known)
        if type(weight) is not int or not 0 <= weight <= MAX_WEIGHT:
            raise ValidationError(
                f"'split': the weight of '{version}' must be a whole number 0–{MAX_WEIGHT}."
            )
    if split:
        if sum(split.values()) == 0:
            raise ValidationError("'split': give at least one version a weight above 0.")
        routing["split"] = {version: split[version] for version in sorted(split)}
    sticky = value.get("sticky", "request")
    if sticky not in STICKY:
        raise ValidationError(f"'sticky' is one of {', '.join(STICKY)}.")
    if sticky != "request":
        routing["sticky"] = sticky
    aliases = value.get("aliases") or {}
    if not isinstance(aliases, Mapping):
        raise ValidationError('\'aliases\' maps names to versions, e.g. {"stable": "v1"}.')
    if len(aliases) > MAX_ALIASES:
        raise ValidationError(f"'aliases': at most {MAX_ALIASES}.")
    for alias, version in aliases.items():
        if not isinstance(alias, str) or not LABEL.fullmatch(alias):
            raise ValidationError(f"'aliases': {alias!r} is not a name: use {LABEL_HELP}.")
        if alias in known:
            raise ValidationError(f"'aliases': '{alias}' is already a version's name.")
        _known_version(f"aliases.{alias}", version, known)
    if aliases:
        routing["aliases"] = {alias: aliases[alias] for alias in sorted(aliases)}
    return routing


def _known_version(where: str, version: object, known: set[str]) -> None:
    if not isinstance(version, str) or version not in known:
        listed = ", ".join(sorted(known)) or "none: label the model's deployments first"
        raise ValidationError(f"'{where}': {version!r} is not a version of this model ({listed}).")


def clean_label(value: str) -> None:
    """A deployment's version label: empty (no versions) or a label."""
    if value and not LABEL.fullmatch(value):
        raise ValidationError(f"Use {LABEL_HELP}.")


def targets(routing: Mapping[str, Any], versions: Iterable[str]) -> set[str]:
    """What ``model@…`` may name: the versions and the aliases."""
    return set(versions) | set(routing.get("aliases", {}))


def clean_pins(value: Any, routes: Mapping[str, set[str]]) -> dict[str, str]:
    """A use case's pins ``{model: version or alias}``, ``routes`` giving each model's
    targets (only models with versions have any)."""
    if value in (None, ""):
        return {}
    if not isinstance(value, Mapping):
        raise ValidationError('Give a JSON object: {"model": "version or alias"}.')
    for model, target in value.items():
        options = routes.get(model)
        if not options:
            raise ValidationError(f"'{model}' is not a model with versions.")
        if not isinstance(target, str) or target not in options:
            raise ValidationError(
                f"'{model}': {target!r} is not one of its versions or aliases "
                f"({', '.join(sorted(options))})."
            )
    return {model: value[model] for model in sorted(value)}
