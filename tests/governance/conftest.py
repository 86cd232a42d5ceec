from __future__ import annotations

import pytest


@pytest.fixture
def live_valkey_settings(settings, valkey_url: str, valkey_client):
    """Point the Django side at the test Valkey (flushed by valkey_client)."""
    settings.VALKEY_URL = valkey_url
    return settings


@pytest.fixture
def company_guardrails(monkeypatch):
    """The catalogue with a company's own detectors added by dotted path (read afresh)."""
    from guardrails.catalogue import entries
    from tests.support.detectors import COMPANY_DETECTORS

    monkeypatch.setenv("SWITCHYARD_GUARDRAIL_DETECTORS", COMPANY_DETECTORS)
    entries.cache_clear()
    yield entries()
    entries.cache_clear()
