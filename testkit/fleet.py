"""The live fleet view's real processes for tests: the web process (uvicorn serving
config.asgi, websockets included) and the fleet publisher, on the test's Valkey and database."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from ops.processes import PYTHON, ManagedProcess, free_port, http_ready
from testkit.database import database_url
from testkit.factories import PASSWORD


class FleetWeb:
    """The web process (uvicorn serving config.asgi) on a port of its own, restartable on
    that port (what a page sees when its server goes away and comes back), and the fleet
    publisher, stoppable and restartable too."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._env = env
        self.process: ManagedProcess | None = None
        self.publisher: ManagedProcess | None = None

    def start(self) -> None:
        argv = [PYTHON, "-m", "uvicorn", "config.asgi:application", "--port", str(self.port)]
        self.process = ManagedProcess(f"web-{self.port}", argv, env=self._env)
        self.process.start(ready=http_ready(f"{self.url}/accounts/login/", expect=200), timeout=60)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def start_publisher(self) -> None:
        argv = [PYTHON, "-m", "portal.fleet.publisher"]
        publisher = ManagedProcess("fleet-publisher", argv, env=self._env)
        self.publisher = publisher
        publisher.start(ready=lambda: "fleet_publisher_started" in publisher.log_text(), timeout=60)

    def stop_publisher(self) -> None:
        if self.publisher is not None:
            self.publisher.stop()
            self.publisher = None


@contextlib.contextmanager
def fleet_web(
    valkey_url: str, run_dir: Path, *, interval_s: float = 1.0, **settings: str
) -> Iterator[FleetWeb]:
    """A web process and a fleet publisher, on the test's Valkey and database; ``settings``:
    more environment (SWITCHYARD_*) for both."""
    env = {
        **settings,
        "SWITCHYARD_VALKEY_URL": valkey_url,
        "SWITCHYARD_DATABASE_URL": database_url(),
        "SWITCHYARD_RUN_DIR": str(run_dir),
        "SWITCHYARD_FLEET_PUBLISH_INTERVAL_SECONDS": str(interval_s),
    }
    web = FleetWeb(env)
    try:
        web.start_publisher()
        web.start()
        yield web
    finally:
        web.stop()
        web.stop_publisher()


def web_password(user: Any) -> None:
    """Give ``user`` the tests' password hashed as a process started by a test checks it:
    the test process hashes with MD5 (tests/conftest.py), the web process keeps the real
    hashers. Few PBKDF2 iterations: the web process upgrades the hash on its first login."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    hasher = PBKDF2PasswordHasher()
    user.password = hasher.encode(PASSWORD, hasher.salt(), iterations=1_000)
    user.save(update_fields=["password"])


def session_cookie(url: str, username: str) -> str:
    """Sign in through the real login form; the session cookie the browser would hold."""
    with httpx.Client(base_url=url, timeout=30) as client:
        form = client.get("/accounts/login/")
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert match is not None, form.text
        answer = client.post(
            "/accounts/login/",
            data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": match[1]},
        )
        assert answer.status_code == 302, answer.text
        cookie = client.cookies.get("sessionid")
        assert cookie, "no session cookie after signing in"
        return cookie
