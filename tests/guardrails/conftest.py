"""One loaded Engine for the whole session: every worker detector's models load once (about
15 s), as they do once per guardrail worker process. And the guardrail service's fixture."""

from __future__ import annotations

import pytest

from guardrails.engine import Engine
from testkit.guardrail_service import start_guardrail_service

__all__ = ["engine", "start_guardrail_service"]


@pytest.fixture(scope="session")
def engine() -> Engine:
    return Engine()
