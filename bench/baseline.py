"""Before and after in one run: a detached checkout of another commit (``--baseline REF``),
whose processes a bench starts beside this checkout's, under the same load of others."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def baseline_checkout(ref: str | None) -> Iterator[Path | None]:
    """A detached worktree of ``ref`` for the baseline gateway, removed afterwards."""
    if ref is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="switchyard-baseline-") as parent:
        path = Path(parent) / "checkout"
        repo = Path(__file__).resolve().parents[1]
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(path), ref],
            check=True,
        )
        try:
            yield path
        finally:
            subprocess.run(
                ["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], check=False
            )
