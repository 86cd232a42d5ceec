"""The README documents every SWITCHYARD_* variable the code reads, and its two commands work."""

from __future__ import annotations

import re

from config.processes import REPO_ROOT

SOURCES = [
    "config",
    "gateway",
    "governance",
    "portal",
    "scheduler",
    "guardrails",
    "s3endpoint",
    "Makefile",
]
# Reads of a variable: our typed helpers, os.environ.get and os.getenv (a name that only
# appears inside a code snippet shown to users is not configuration).
READS = re.compile(r"(?:env_[a-z]+|environ\.get|getenv)\(\s*\"(SWITCHYARD_[A-Z0-9_]+)\"")


def variables_read_by_the_code() -> set[str]:
    found: set[str] = set()
    for source in SOURCES:
        path = REPO_ROOT / source
        files = [path] if path.is_file() else list(path.rglob("*.py"))
        for file in files:
            found |= set(READS.findall(file.read_text()))
            found |= set(re.findall(r"^(SWITCHYARD_[A-Z0-9_]+) \?=", file.read_text(), re.M))
    return found


def test_every_variable_the_code_reads_is_documented() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    variables = variables_read_by_the_code()
    assert "SWITCHYARD_VALKEY_URL" in variables  # the scan itself works
    missing = sorted(v for v in variables if f"`{v}`" not in readme)
    assert missing == [], f"undocumented in README: {missing}"


def test_the_readme_opens_with_the_two_commands_ci_runs() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    first_block = readme.split("```sh", 1)[1].split("```", 1)[0]
    assert "make up" in first_block
    assert "make test" in first_block
    assert "make test" in (REPO_ROOT / ".ci" / "run").read_text()


def test_the_example_production_env_sets_only_variables_the_code_reads() -> None:
    """A misspelt name in deploy/example.env would be copied into real deploys and ignored."""
    example = (REPO_ROOT / "deploy" / "example.env").read_text()
    names = re.findall(r"^(SWITCHYARD_[A-Z0-9_]+)=", example, re.M)
    assert "SWITCHYARD_RECORDS_KEYS_FILE" in names  # the scan itself works
    unknown = sorted({n.removesuffix("_FILE") for n in names} - variables_read_by_the_code())
    assert unknown == [], f"deploy/example.env sets variables nothing reads: {unknown}"
