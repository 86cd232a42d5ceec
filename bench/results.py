"""bench/RESULTS.md: each benchmark owns one ``## `` section and rewrites only that one."""

from __future__ import annotations

import re
from pathlib import Path

from ops.processes import REPO_ROOT

RESULTS = REPO_ROOT / "bench" / "RESULTS.md"


def write_section(section: str, text: str, path: Path = RESULTS) -> None:
    """Replace the section headed ``section`` (up to the next ``## ``) with ``text``, or append
    it when the file has none yet."""
    existing = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(section)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(existing):
        updated = pattern.sub(lambda _: text.rstrip() + "\n\n", existing).rstrip() + "\n"
    else:
        updated = existing.rstrip() + "\n\n" + text
    path.write_text(updated)
