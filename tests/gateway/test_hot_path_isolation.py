"""The gateway process must not load Django: no ORM can creep onto the hot path."""

from __future__ import annotations

import subprocess

from ops.processes import PYTHON, REPO_ROOT


def test_importing_the_gateway_loads_neither_django_nor_celery() -> None:
    probe = (
        "import sys, gateway.asgi; "
        "bad = sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('django', 'celery', 'governance')); "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [PYTHON, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"gateway imported: {result.stdout}{result.stderr}"
