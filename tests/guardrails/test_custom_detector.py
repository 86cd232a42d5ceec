"""A company's own detector, named by dotted path in the environment, is catalogued, validated
and run like a built-in one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ops.processes import REPO_ROOT

PROGRAM = """
import json
from guardrails.base import SettingsError
from guardrails.catalogue import entries, validate_selection
from guardrails.engine import Check, Engine

entry = entries()["bank_account_no"]
settings = validate_selection("bank_account_no", "both", "redact", {})
try:
    validate_selection("bank_account_no", "request", "block", {"colour": "red"})
    refused = None
except SettingsError as exc:
    refused = str(exc)
outcome = Engine(["bank_account_no"]).run(
    ["Move 100 from ACME-12345678 to savings."], [Check("bank_account_no", "redact", settings)]
)
print(json.dumps({"label": entry.label, "redacts": entry.redacts, "runs_on": entry.runs_on,
                  "settings": settings, "refused": refused, "outcome": outcome.as_json()}))
"""


def test_a_detector_named_by_dotted_path_redacts_like_a_built_in():
    """GIVEN SWITCHYARD_GUARDRAIL_DETECTORS naming the class docs/guardrails-catalogue.md shows
    WHEN a selection of it is validated and run in a worker's engine
    THEN it is in the catalogue with its label, its settings are checked, and it redacts."""
    env = {
        **os.environ,
        "SWITCHYARD_GUARDRAIL_DETECTORS": (
            "bank_account_no=tests.guardrails.example_detector:AccountNumberDetector"
        ),
    }
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
        cwd=REPO_ROOT,
    )
    report = json.loads(result.stdout)
    assert report["label"] == "Acme account numbers"
    assert report["redacts"] is True
    assert report["runs_on"] == "worker"
    assert report["settings"] == {"score": 0.9}
    assert "only setting is 'score'" in report["refused"]
    assert report["outcome"] == {
        "texts": ["Move 100 from <ACME_ACCOUNT> to savings."],
        "findings": [
            {
                "guardrail": "bank_account_no",
                "action": "redacted",
                "entities": {"ACME_ACCOUNT": 1},
                "score": 0.9,
            }
        ],
        "blocked": None,
    }
