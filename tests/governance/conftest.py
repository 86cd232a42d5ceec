from __future__ import annotations

import pytest


@pytest.fixture
def company_guardrails(monkeypatch):
    """The catalogue with a company's own detectors added by dotted path (read afresh)."""
    from guardrails.catalogue import entries
    from testkit.detectors import COMPANY_DETECTORS

    monkeypatch.setenv("SWITCHYARD_GUARDRAIL_DETECTORS", COMPANY_DETECTORS)
    entries.cache_clear()
    yield entries()
    entries.cache_clear()
