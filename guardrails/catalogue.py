"""The catalogue: every guardrail a use case may select, where it runs, what it can do.

Cheap to import (no detector is loaded): governance validates selections against it, the
gateway splits a use case's selections by where they run. A company adds its own detector by
dotted path: ``SWITCHYARD_GUARDRAIL_DETECTORS="name=package.module:Class,…"`` (read by
``extra_entries``), runs in the worker processes like the built-in ones.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from guardrails.base import Detector, SettingsError

Stage = Literal["request", "response"]
Action = Literal["block", "redact", "flag"]
RunsOn = Literal["worker", "fleet"]

STAGES: tuple[Stage, ...] = ("request", "response")
ACTIONS: tuple[Action, ...] = ("block", "redact", "flag")


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    label: str
    stages: frozenset[str]
    #: whether ``redact`` is a valid action (its findings carry spans)
    redacts: bool
    #: "worker": a CPU detector in the guardrail workers; "fleet": a model the fleet serves,
    #: asked by the gateway itself (its I/O is awaited, not run in a worker)
    runs_on: RunsOn
    #: "package.module:Class"
    detector: str
    description: str = ""


_BOTH: frozenset[str] = frozenset(STAGES)
_REQUEST = frozenset({"request"})
_RESPONSE = frozenset({"response"})

BUILT_IN: tuple[Entry, ...] = (
    Entry(
        "pii",
        "Personal data (PII)",
        _BOTH,
        True,
        "worker",
        "guardrails.detectors.pii:PiiDetector",
        "Presidio analyzer with spaCy: people, e-mail, phone, card numbers, IBAN, IP, … and "
        "custom patterns per use case.",
    ),
    Entry(
        "secrets",
        "Secrets and credentials",
        _BOTH,
        True,
        "worker",
        "guardrails.detectors.secrets:SecretsDetector",
        "API keys, tokens, private keys and passwords.",
    ),
    Entry(
        "invisible_text",
        "Invisible / smuggled characters",
        _BOTH,
        True,
        "worker",
        "guardrails.detectors.invisible:InvisibleTextDetector",
        "Zero-width, bidirectional-override, tag and private-use characters.",
    ),
    Entry(
        "prompt_injection",
        "Prompt injection / jailbreak",
        _REQUEST,
        False,
        "worker",
        "guardrails.detectors.injection:PromptInjectionDetector",
        "A classifier whose weights ship in a package.",
    ),
    Entry(
        "toxicity",
        "Toxicity / profanity",
        _BOTH,
        False,
        "worker",
        "guardrails.detectors.toxicity:ToxicityDetector",
        "A linear model shipped in its wheel.",
    ),
    Entry(
        "max_prompt_tokens",
        "Maximum prompt tokens",
        _REQUEST,
        False,
        "worker",
        "guardrails.detectors.limits:MaxPromptTokensDetector",
        "Refuses prompts longer than a number of tokens.",
    ),
    Entry(
        "language",
        "Languages allowed",
        _BOTH,
        False,
        "worker",
        "guardrails.detectors.limits:LanguageDetector",
        "Text in a language outside the allowed list.",
    ),
    Entry(
        "banned_substrings",
        "Banned substrings",
        _BOTH,
        True,
        "worker",
        "guardrails.detectors.limits:BannedSubstringsDetector",
        "Words or phrases the use case must not send or receive.",
    ),
    Entry(
        "banned_topics",
        "Denied topics (e.g. financial advice)",
        _BOTH,
        False,
        "fleet",
        "guardrails.judge:GuardModelJudge",
        "A guard model on the fleet (Llama Guard's format) judges the text against topics.",
    ),
    Entry(
        "groundedness",
        "Groundedness (RAG)",
        _RESPONSE,
        False,
        "fleet",
        "guardrails.grounding:GroundednessCheck",
        "The answer's sentences must be supported by the documents the request supplied.",
    ),
)


def _parse_extra(spec: str) -> tuple[Entry, ...]:
    """``name=package.module:Class[@stages][!redacts]`` entries, comma separated."""
    entries = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, path = item.partition("=")
        if not name or ":" not in path:
            raise ValueError(
                f"SWITCHYARD_GUARDRAIL_DETECTORS: {item!r} is not name=package.module:Class"
            )
        detector = load_class(path)
        stages = frozenset(getattr(detector, "stages", STAGES))
        entries.append(
            Entry(
                name.strip(),
                getattr(detector, "label", name.strip()),
                stages,
                bool(getattr(detector, "redacts", False)),
                "worker",
                path,
                (detector.__doc__ or "").strip().split("\n")[0],
            )
        )
    return tuple(entries)


@cache
def entries() -> Mapping[str, Entry]:
    """The catalogue: built-in entries and the company's own (environment, read once)."""
    found = {entry.name: entry for entry in BUILT_IN}
    for entry in _parse_extra(os.environ.get("SWITCHYARD_GUARDRAIL_DETECTORS", "")):
        found[entry.name] = entry
    return found


def load_class(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def detector_for(name: str) -> Detector:
    """A new instance of ``name``'s detector (not loaded: call ``load``)."""
    detector: Detector = load_class(entries()[name].detector)()
    return detector


def validate_selection(
    name: str, stage: str, action: str, settings: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A selection's settings made complete, or ``SettingsError`` naming what is wrong.
    ``stage``: "request", "response" or "both"."""
    entry = entries().get(name)
    if entry is None:
        raise SettingsError(f"Unknown guardrail '{name}'; known: {', '.join(sorted(entries()))}.")
    stages: frozenset[str] = _BOTH if stage == "both" else frozenset({stage})
    if not stages <= _BOTH:
        raise SettingsError(f"Stage must be request, response or both, not '{stage}'.")
    if not stages <= entry.stages:
        raise SettingsError(
            f"Guardrail '{name}' runs on {' and '.join(sorted(entry.stages))} only."
        )
    if action not in ACTIONS:
        raise SettingsError(f"Mode must be one of {', '.join(ACTIONS)}, not '{action}'.")
    if action == "redact" and not entry.redacts:
        raise SettingsError(f"Guardrail '{name}' cannot redact; choose block or flag.")
    if settings is not None and not isinstance(settings, Mapping):
        raise SettingsError("Settings must be an object.")
    settings = dict(settings or {})
    roles = settings.pop(ROLES_SETTING, None)
    validated = detector_for(name).validate(settings)
    if roles is not None:
        validated[ROLES_SETTING] = _roles(roles)
    return validated


#: The one setting every guardrail takes besides its detector's own: the message roles whose
#: texts it reads ("tool": where an agent's untrusted text enters), absent for all of them.
ROLES_SETTING = "roles"
#: what said a text (guardrails/texts.py): a chat message's role; a prompt is the user's, an
#: answer the assistant's, a retrieved document (the chat's ``documents``) the document's
ROLES = ("system", "developer", "user", "assistant", "tool", "function", "document")


def _roles(value: Any) -> list[str]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(role, str) and role in ROLES for role in value)
    ):
        raise SettingsError(
            f"'{ROLES_SETTING}' must be a non-empty list of message roles ({', '.join(ROLES)})."
        )
    return sorted(set(value), key=ROLES.index)
