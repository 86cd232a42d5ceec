"""The batcher never touches the ORM: importing it loads no database layer, no app registry,
no governance or portal code (celery brings Django's version helpers only)."""

from __future__ import annotations

import subprocess

from ops.processes import PYTHON, REPO_ROOT


def test_importing_the_batcher_loads_no_orm() -> None:
    probe = (
        "import sys, scheduler.batcher.__main__; "
        "bad = sorted(m for m in sys.modules if m.startswith(('django.db', 'django.apps', "
        "'django.conf', 'governance', 'portal', 'scheduler.models', 'scheduler.tasks'))); "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [PYTHON, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"the batcher imported: {result.stdout}{result.stderr}"
