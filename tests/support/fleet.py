"""The live fleet view's real processes for tests: the web process (uvicorn serving
config.asgi, websockets included) and the fleet publisher, on the test's Valkey and database."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from config.processes import PYTHON, ManagedProcess
from tests.conftest import database_url
from tests.factories import PASSWORD
from tests.support.web_process import running_web


@contextlib.contextmanager
def fleet_web(valkey_url: str, run_dir: Path, *, interval_s: float = 1.0) -> Iterator[str]:
    """A web process and a fleet publisher; yields the web process's base URL."""
    env = {
        "SWITCHYARD_VALKEY_URL": valkey_url,
        "SWITCHYARD_DATABASE_URL": database_url(),
        "SWITCHYARD_RUN_DIR": str(run_dir),
        "SWITCHYARD_FLEET_PUBLISH_INTERVAL_SECONDS": str(interval_s),
    }
    publisher = ManagedProcess("fleet-publisher", [PYTHON, "-m", "portal.fleet.publisher"], env=env)
    publisher.start(ready=lambda: "fleet_publisher_started" in publisher.log_text(), timeout=60)
    try:
        with running_web(env) as url:
            yield url
    finally:
        publisher.stop()


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
