from __future__ import annotations

import pytest


@pytest.fixture
def live_valkey_settings(settings, valkey_url: str, valkey_client):
    """Point the Django side at the test Valkey (flushed by valkey_client)."""
    settings.VALKEY_URL = valkey_url
    return settings
