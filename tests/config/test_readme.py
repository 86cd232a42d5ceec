"""Every SWITCHYARD_* variable the code reads is documented (the README lists the few a first
run needs, docs/configuration.md all of them), and the README's two commands work."""

from __future__ import annotations

import re

from ops.processes import REPO_ROOT

SOURCES = [
    "runtime",
    "guardrails",
    "gateway",
    "governance",
    "records",
    "scheduler",
    "portal",
    "s3endpoint",
    "config",
    "ops",
    "simulator",
    "Makefile",
]
# Where the variables are documented: the README's short table and the full reference.
DOCUMENTED_IN = ["README.md", "docs/configuration.md"]
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
    docs = "\n".join((REPO_ROOT / name).read_text() for name in DOCUMENTED_IN)
    variables = variables_read_by_the_code()
    assert "SWITCHYARD_VALKEY_URL" in variables  # the scan itself works
    assert "SWITCHYARD_BIND_HOST" in variables  # ops/ is scanned too
    assert "SWITCHYARD_WEBHOOK_ALLOWED_NETWORKS" in variables  # and runtime/
    missing = sorted(v for v in variables if f"`{v}`" not in docs)
    assert missing == [], f"undocumented in {' or '.join(DOCUMENTED_IN)}: {missing}"


def test_the_full_reference_documents_every_variable_the_code_reads() -> None:
    """The README keeps only a first run's few; the reference page must hold them all."""
    reference = (REPO_ROOT / "docs" / "configuration.md").read_text()
    missing = sorted(v for v in variables_read_by_the_code() if f"`{v}`" not in reference)
    assert missing == [], f"undocumented in docs/configuration.md: {missing}"


def test_the_readme_links_the_full_reference() -> None:
    assert "(docs/configuration.md)" in (REPO_ROOT / "README.md").read_text()


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
