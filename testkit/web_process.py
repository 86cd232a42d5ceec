"""A real web process (uvicorn serving config.asgi) for tests that go through it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ops.processes import PYTHON, ManagedProcess, free_port, http_ready


@contextlib.contextmanager
def running_web(env: dict[str, str]) -> Iterator[str]:
    """A real web process (uvicorn serving config.asgi) with ``env`` (database, Valkey, object
    storage); yields its base URL, for a gateway's ``SWITCHYARD_CONTROL_URL``."""
    port = free_port()
    web = ManagedProcess(
        f"web-{port}",
        [PYTHON, "-m", "uvicorn", "config.asgi:application", "--port", str(port)],
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    web.start(ready=http_ready(f"{url}/accounts/login/", expect=200), timeout=60)
    try:
        yield url
    finally:
        web.stop()
