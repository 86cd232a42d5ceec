"""Real headless Chromium (Debian's, never Playwright's download) against a live Django server.

The server is Django's own threaded live server bound to 127.0.0.1, sharing the test database
(``transaction=True``, so what the browser's requests commit is what the test sees, and
``on_commit`` publishing to Valkey really happens).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        # Not a skip: a browser test that silently does not run proves nothing.
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (make test does it)")
    # Playwright's sync API keeps an asyncio loop on this thread, which makes Django refuse
    # ORM calls here; the test code is synchronous all the same, so lift the guard while the
    # browser lives (the live server answers on its own thread, unaffected).
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def portal_server(transactional_db: None) -> Iterator[str]:
    """The portal served on 127.0.0.1 from this process, over the test database."""
    from pytest_django.live_server_helper import LiveServer

    server = LiveServer("127.0.0.1:0")  # 127.0.0.1 is in the embedded ALLOWED_HOSTS
    try:
        yield server.url
    finally:
        server.stop()
        _join_request_threads()


def _join_request_threads(timeout: float = 10.0) -> None:
    """Wait for the requests the browser still had in flight when the test ended. Django's
    threaded live server does not join its handler threads (they are daemons), so a request
    that audits (a sign-in, a record read) could otherwise commit after this test's database
    was flushed: an audit event no later test wrote, or two writers of one chain sequence."""
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and "process_request_thread" in thread.name:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise AssertionError(f"{thread.name} still serves a request after {timeout}s")


@pytest.fixture
def screenshot_dir(tmp_path: Path) -> Path:
    """Where the pages' screenshots go (pytest's temp dir; ``--basetemp`` puts it in view)."""
    directory = tmp_path / "screenshots"
    directory.mkdir()
    return directory
