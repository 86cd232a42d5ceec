"""One loaded Engine for the whole session: every worker detector's models load once (about
15 s), as they do once per guardrail worker process."""

from __future__ import annotations

import pytest

from guardrails.engine import Engine


@pytest.fixture(scope="session")
def engine() -> Engine:
    return Engine()
