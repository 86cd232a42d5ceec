"""The catalogue's worker entries resolve to these detectors; validating a selection loads no
model (governance does it on every save)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from guardrails.base import SettingsError
from guardrails.catalogue import entries, validate_selection

WORKERS = sorted(name for name, entry in entries().items() if entry.runs_on == "worker")
HEAVY = ("torch", "spacy", "presidio_analyzer", "sklearn", "profanity_check", "langid",
         "tiktoken", "detect_secrets", "nanoguard")  # fmt: skip


def test_validating_every_worker_guardrail_imports_no_model_library():
    """GIVEN a fresh interpreter, as governance's web process is
    WHEN every worker guardrail's default selection is validated through the catalogue
    THEN none of the model libraries has been imported."""
    code = f"""
import json, sys
from guardrails.catalogue import validate_selection
settings = {{"banned_substrings": {{"substrings": ["x"]}}}}
for name in {WORKERS!r}:
    validate_selection(name, "request" if name in ("prompt_injection", "max_prompt_tokens")
                       else "both", "flag", settings.get(name, {{}}))
print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(result.stdout) == []


@pytest.mark.parametrize("name", WORKERS)
def test_each_worker_entry_names_a_detector_whose_name_matches(engine, name):
    assert engine.detector(name).name == name


def test_redact_is_offered_only_where_findings_carry_spans():
    redacting = {name for name in WORKERS if entries()[name].redacts}
    assert redacting == {"pii", "secrets", "invisible_text", "banned_substrings"}
    validate_selection("pii", "request", "redact", {})


def test_any_guardrail_may_be_scoped_to_message_roles():
    """``roles`` is the one setting every guardrail takes besides its detector's: checked
    here, kept in the selection (sorted by the roles' order, once each), never passed to the
    detector's own validation."""
    settings = validate_selection(
        "prompt_injection", "request", "block", {"roles": ["tool", "user", "tool"]}
    )
    assert settings["roles"] == ["user", "tool"]
    assert settings["threshold"] == 0.999
    fleet = validate_selection(
        "banned_topics", "request", "block", {"model": "guard", "roles": ["tool"]}
    )
    assert fleet["roles"] == ["tool"]
    assert "roles" not in validate_selection("secrets", "both", "redact", {})


@pytest.mark.parametrize("roles", [[], "tool", ["tools"], [1]])
def test_a_scope_that_is_not_a_list_of_roles_is_refused(roles):
    with pytest.raises(SettingsError, match="'roles' must be a non-empty list of message roles"):
        validate_selection("secrets", "request", "block", {"roles": roles})
