"""One Valkey URL in, the spelling each client library needs out.

Operators configure a single ``SWITCHYARD_VALKEY_URL``. valkey-py accepts ``valkey://``,
``valkeys://`` and ``unix://``; Celery/kombu only know the Redis spellings (``redis://``,
``rediss://``, ``redis+socket://``), and a Valkey server speaks that protocol.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

_TO_REDIS = {"valkey": "redis", "valkeys": "rediss", "redis": "redis", "rediss": "rediss"}


def validate_valkey_url(url: str) -> str:
    scheme = urlsplit(url).scheme
    if scheme not in {"valkey", "valkeys", "redis", "rediss", "unix"}:
        raise ValueError(
            f"SWITCHYARD_VALKEY_URL has scheme {scheme!r}; use valkey://, valkeys:// or unix://"
        )
    return url


def for_kombu(url: str) -> str:
    """The broker / result-backend URL for Celery."""
    parts = urlsplit(validate_valkey_url(url))
    if parts.scheme == "unix":
        # Spelled by hand: urlunsplit drops the "//" when there is no host.
        return f"redis+socket://{parts.path}" + (f"?{parts.query}" if parts.query else "")
    return urlunsplit((_TO_REDIS[parts.scheme], *parts[1:]))


def for_valkey_py(url: str) -> str:
    """valkey-py understands every accepted spelling; normalise redis:// to valkey:// anyway."""
    parts = urlsplit(validate_valkey_url(url))
    if parts.scheme == "unix":
        return url
    scheme = {"redis": "valkey", "rediss": "valkeys"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, *parts[1:]))
