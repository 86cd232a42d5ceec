"""The live fleet view's websocket through a real web process (uvicorn serving config.asgi)
and a real fleet publisher, both on the test's Valkey and database; people sign in through
the real login form.

Personas: olivia (officer) and audrey (auditor) may watch the fleet; devon (developer of
acme) may not, and neither may an anonymous visitor or another site's page.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import valkey
import websockets
from django.contrib.auth import get_user_model
from websockets.asyncio.client import ClientConnection

from gateway.scheduling import fleet_entry, keys
from governance.roles import Role, roles_set
from testkit.factories import make_tenant, make_user
from testkit.fleet import fleet_web, session_cookie, web_password
from testkit.policy import PolicyBuilder

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "granite"
R1 = "http://10.1.0.1:8000"
INTERVAL_S = 0.5
RECHECK_S = 1.0  # how often an open socket's session is checked again (30 s by default)


def _valkey_ms(client: valkey.Valkey) -> int:
    seconds, micros = client.time()  # type: ignore[misc]
    return int(seconds) * 1000 + int(micros) // 1000


def _write_fleet(client: valkey.Valkey, running: int) -> None:
    # What the watcher writes (its own writer); fresh each time it is called.
    entry = fleet_entry(waiting=0, running=running, kv_usage=0.5, scraped_at_ms=_valkey_ms(client))
    client.hset(keys.fleet(MODEL), mapping={R1: entry})


@pytest.fixture
def web(valkey_client: valkey.Valkey, valkey_url: str, tmp_path: Path) -> Iterator[str]:
    for user in (
        make_user("olivia", Role.OFFICER),
        make_user("audrey", Role.AUDITOR),
        make_user("devon", Role.DEVELOPER, tenants=(make_tenant("acme"),)),
    ):
        web_password(user)
    PolicyBuilder().model(MODEL, [R1]).priority_class("prod", rank=1).publish(valkey_client)
    _write_fleet(valkey_client, running=3)
    with fleet_web(
        valkey_url,
        tmp_path,
        interval_s=INTERVAL_S,
        SWITCHYARD_FLEET_RECHECK_SECONDS=str(RECHECK_S),
    ) as fleet:
        yield fleet.url


def _ws(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws/fleet/"


async def _connect(url: str, cookie: str | None, *, origin: str | None = None) -> ClientConnection:
    headers = {"Cookie": f"sessionid={cookie}"} if cookie else {}
    return await websockets.connect(
        _ws(url),
        additional_headers=headers,
        origin=origin or url,  # type: ignore[arg-type]
        open_timeout=10,
    )


async def _next(socket: ClientConnection, wait_s: float = 5.0) -> dict[str, Any]:
    raw = await asyncio.wait_for(socket.recv(), wait_s)
    message: dict[str, Any] = json.loads(raw)
    return message


def _replica(snapshot: dict[str, Any]) -> dict[str, Any]:
    [model] = [m for m in snapshot["models"] if m["model"] == MODEL]
    [replica] = model["replicas"]
    row: dict[str, Any] = replica
    return row


def test_several_pages_get_the_same_snapshots_every_tick_and_a_reconnect_gets_one_at_once(
    web: str, valkey_client: valkey.Valkey
) -> None:
    """GIVEN olivia in two tabs and audrey in one
    WHEN the publisher ticks
    THEN each tab gets the latest snapshot on connecting, then the same new ones as the
    others; a tab that drops and comes back gets the current picture at once."""
    olivia, audrey = session_cookie(web, "olivia"), session_cookie(web, "audrey")

    async def scenario() -> None:
        sockets = [
            await _connect(web, olivia),
            await _connect(web, olivia),
            await _connect(web, audrey),
        ]
        try:
            firsts = [await _next(socket, wait_s=INTERVAL_S * 4) for socket in sockets]
            for first in firsts:
                assert _replica(first)["running"] == 3
                assert _replica(first)["replica"] == R1
            # Fan-out: the next tick's snapshot reaches every page, identical.
            newest = max(first["at_ms"] for first in firsts)
            seen: list[list[int]] = []
            for socket in sockets:
                ticks: list[int] = []
                while not ticks or ticks[-1] <= newest:
                    ticks.append((await _next(socket))["at_ms"])
                seen.append(ticks)
            assert len({ticks[-1] for ticks in seen}) == 1, seen

            # A page goes away; the fleet changes; it comes back.
            await sockets[0].close()
            _write_fleet(valkey_client, running=7)
            await asyncio.sleep(INTERVAL_S * 2.5)  # the publisher has read the change
            started = time.monotonic()
            sockets[0] = await _connect(web, olivia)
            again = await _next(sockets[0], wait_s=INTERVAL_S * 4)
            assert time.monotonic() - started < INTERVAL_S + 1.0
            assert _replica(again)["running"] == 7
            # ... and it keeps getting ticks after the reconnect.
            later = await _next(sockets[0])
            assert later["at_ms"] > again["at_ms"]
        finally:
            for socket in sockets:
                await socket.close()

    asyncio.run(scenario())


def _refusal(web: str, cookie: str | None, *, origin: str | None = None) -> int | None:
    async def scenario() -> int | None:
        socket = await _connect(web, cookie, origin=origin)
        try:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await _next(socket, wait_s=5)
        finally:
            await socket.close()
        return closed.value.rcvd.code if closed.value.rcvd else None

    return asyncio.run(scenario())


def test_a_developer_and_an_anonymous_visitor_are_refused_with_4403(web: str) -> None:
    """GIVEN devon (developer) and someone not signed in
    WHEN they open the websocket
    THEN it closes with 4403 before any snapshot is sent."""
    assert _refusal(web, session_cookie(web, "devon")) == 4403
    assert _refusal(web, None) == 4403
    assert _refusal(web, "not-a-session") == 4403


def test_an_open_socket_closes_when_the_role_is_revoked_or_the_person_signs_out(
    web: str,
) -> None:
    """GIVEN olivia and audrey watching the fleet
    WHEN olivia's officer role is revoked and audrey signs out (in another tab)
    THEN both sockets are closed with 4403 within the recheck interval and a tick."""
    olivia, audrey = session_cookie(web, "olivia"), session_cookie(web, "audrey")

    def revoke_olivia_and_sign_audrey_out() -> None:
        roles_set(get_user_model().objects.get(username="olivia"), [])
        with httpx.Client(base_url=web, cookies={"sessionid": audrey}) as client:
            page = client.get("/fleet/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
            assert token is not None, "no sign-out form on the page"
            out = client.post("/accounts/logout/", data={"csrfmiddlewaretoken": token[1]})
            assert out.status_code == 302, out.text

    async def closed_with(socket: ClientConnection) -> int | None:
        """The close code, or None if it stayed open past the recheck and a few ticks."""
        deadline = time.monotonic() + RECHECK_S + INTERVAL_S * 6
        try:
            while time.monotonic() < deadline:  # ticks arrive until the next recheck
                await _next(socket, wait_s=RECHECK_S + INTERVAL_S * 4)
        except websockets.ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd else None
        return None

    async def scenario() -> list[int | None]:
        sockets = [await _connect(web, olivia), await _connect(web, audrey)]
        try:
            for socket in sockets:
                await _next(socket)
            await asyncio.to_thread(revoke_olivia_and_sign_audrey_out)
            return [await closed_with(socket) for socket in sockets]
        finally:
            for socket in sockets:
                await socket.close()

    assert asyncio.run(scenario()) == [4403, 4403]


def test_another_sites_page_cannot_open_it_with_the_visitors_cookie(web: str) -> None:
    """GIVEN olivia signed in
    WHEN a page of another origin opens the websocket with her cookie
    THEN the handshake is refused (403), before the consumer runs."""
    olivia = session_cookie(web, "olivia")

    async def scenario() -> None:
        with pytest.raises(websockets.InvalidStatus) as refused:
            await _connect(web, olivia, origin="http://evil.example")
        assert refused.value.response.status_code == 403

    asyncio.run(scenario())


def test_the_page_is_authorised_like_its_websocket(web: str) -> None:
    """GIVEN olivia, audrey, devon and an anonymous visitor
    WHEN each asks for /fleet/
    THEN the officer and the auditor get the page, with its script and the latest snapshot;
    the developer is refused and the visitor sent to sign in."""
    for name in ("olivia", "audrey"):
        with httpx.Client(base_url=web, cookies={"sessionid": session_cookie(web, name)}) as c:
            page = c.get("/fleet/")
            assert page.status_code == 200
            assert 'id="fleet-status"' in page.text
            assert "portal/fleet.js" in page.text
            assert f'"model": "{MODEL}"' in page.text  # the snapshot the script starts from
            assert 'href="/fleet/"' in page.text  # the nav item
    with httpx.Client(base_url=web, cookies={"sessionid": session_cookie(web, "devon")}) as c:
        page = c.get("/fleet/")
        assert page.status_code == 403
        home = c.get("/")
        assert 'href="/fleet/"' not in home.text  # no nav item for a developer
    anonymous = httpx.get(f"{web}/fleet/")
    assert anonymous.status_code == 302
    assert anonymous.headers["location"].startswith("/accounts/login/")
