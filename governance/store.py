"""The Valkey client of the web and worker processes: one pooled client per URL (settings may
change between tests). The gateway has its own, asyncio and pipelined (gateway/autopipeline.py)."""

from __future__ import annotations

from functools import lru_cache

import valkey
from django.conf import settings

from runtime.valkey_urls import sync_client


@lru_cache(maxsize=4)
def _client_for(url: str) -> valkey.Valkey:
    return sync_client(url, socket_timeout=2.0, socket_connect_timeout=1.0)


def valkey_client() -> valkey.Valkey:
    """The Valkey at ``settings.VALKEY_URL``, pooled."""
    return _client_for(settings.VALKEY_URL)
