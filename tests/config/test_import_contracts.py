"""The import contracts (pyproject.toml, ``[tool.importlinter]``; docs/architecture.md, "Floors")
hold on the tree, and they catch what they are for: an import up the floors, or a circle,
added to a copy of the tree is reported by name. `make lint` runs the same check."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ops.processes import REPO_ROOT

LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))
PACKAGES = (
    "runtime", "guardrails", "gateway", "governance", "records", "scheduler", "portal",
    "s3endpoint", "config", "ops", "simulator", "testkit", "tests", "bench",
)  # fmt: skip


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache"],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages and pyproject.toml, copied: each test breaks its own copy of one file."""
    root = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(
            REPO_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(REPO_ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_tree_keeps_every_contract() -> None:
    result = _lint(REPO_ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken." in result.stdout


def _lint_with_line(root: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    """The contracts checked on the copy with ``line`` added to one module, then put back."""
    target = root / module
    original = target.read_text()
    target.write_text(original + f"\n{line}\n")
    try:
        return _lint(root)
    finally:
        target.write_text(original)


def test_an_import_up_the_floors_is_reported(tree_copy: Path) -> None:
    """Governance importing the files domain: the circle issue 25 took apart."""
    line = "from scheduler.files import states  # noqa: E402,F401"
    result = _lint_with_line(tree_copy, "governance/choices.py", line)
    assert result.returncode != 0
    assert "Floors: imports go down only BROKEN" in result.stdout
    assert "governance is not allowed to import scheduler" in result.stdout


def test_a_circle_between_siblings_is_reported(tree_copy: Path) -> None:
    """A module of the gateway importing the app that imports it."""
    result = _lint_with_line(tree_copy, "gateway/errors.py", "import gateway.app  # noqa: F401")
    assert result.returncode != 0
    assert "No import circle at any level BROKEN" in result.stdout
    assert "No cycles are allowed in gateway." in result.stdout


def test_django_in_the_gateway_is_reported(tree_copy: Path) -> None:
    result = _lint_with_line(tree_copy, "gateway/costs.py", "import django.conf  # noqa: F401")
    assert result.returncode != 0
    assert "gateway is not allowed to import django" in result.stdout
