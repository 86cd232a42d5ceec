"""The live fleet view through a Valkey outage, with the real processes: the web process
(uvicorn serving config.asgi) and the fleet publisher on a Valkey of this test's own, stopped
and started again on the same port, and real websocket clients.

Valkey is both the fleet's store and the Channels layer, so while it is away nothing reaches
the pages from the publisher: each page's consumer says "unavailable" itself, keeps the
socket open and rejoins when Valkey is back. The publisher keeps running, logs the outage and
retries with a growing wait.

Personas: olivia (officer) in two tabs and audrey (auditor) watch the fleet.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from websockets.asyncio.client import ClientConnection

from governance.roles import Role
from ops.processes import wait_until
from testkit.factories import make_user
from testkit.fleet import FleetWeb, fleet_web, session_cookie, web_password
from testkit.valkey_outage import MODEL, Outage

pytestmark = pytest.mark.django_db(transaction=True)

INTERVAL_S = 0.5
WAIT_S = 30.0  # the longest any single expected message may take (generous: shared CPUs)


@pytest.fixture
def outage(tmp_path: Path) -> Iterator[tuple[Outage, FleetWeb]]:
    for user in (make_user("olivia", Role.OFFICER), make_user("audrey", Role.AUDITOR)):
        web_password(user)
    store = Outage()
    store.start(running=3)
    try:
        with fleet_web(store.url, tmp_path, interval_s=INTERVAL_S) as web:
            yield store, web
    finally:
        if store.server.is_running():
            store.stop()


def _ws(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws/fleet/"


async def _connect(url: str, cookie: str) -> ClientConnection:
    return await websockets.connect(
        _ws(url),
        additional_headers={"Cookie": f"sessionid={cookie}"},
        origin=url,  # type: ignore[arg-type]
        open_timeout=10,
    )


async def _next(socket: ClientConnection) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(await asyncio.wait_for(socket.recv(), WAIT_S))
    return message


async def _until_status(socket: ClientConnection, status: str) -> list[dict[str, Any]]:
    """Messages up to and including the status message ``status`` (snapshots before it)."""
    seen: list[dict[str, Any]] = []
    while not seen or seen[-1].get("status") != status:
        seen.append(await _next(socket))
        assert len(seen) < 200, seen[-3:]
    return seen


async def _next_snapshot(socket: ClientConnection) -> dict[str, Any]:
    while True:
        message = await _next(socket)
        if "status" not in message:
            return message


def _running(snapshot: dict[str, Any]) -> int:
    [model] = [m for m in snapshot["models"] if m["model"] == MODEL]
    [replica] = model["replicas"]
    running: int = replica["running"]
    return running


def _figure(snapshot: dict[str, Any]) -> int | None:
    """The replica's running count, or None while the restarted Valkey holds no fleet yet."""
    rows = [m for m in snapshot["models"] if m["model"] == MODEL]
    if not rows or not rows[0]["replicas"]:
        return None
    running: int | None = rows[0]["replicas"][0]["running"]
    return running


async def _until_running(socket: ClientConnection, running: int) -> None:
    """Snapshots up to the first showing ``running``. A restarted Valkey starts empty and is
    written again a moment later (the policy, then the fleet), so a publisher tick in between
    honestly shows a fleet with no figures; what must never come is any other figure."""
    for _ in range(200):
        figure = _figure(await _next_snapshot(socket))
        if figure == running:
            return
        assert figure is None, f"a snapshot showed running={figure}, expected {running}"
    raise AssertionError(f"no snapshot showed running={running}")


def _retry_waits(log: str) -> list[float]:
    return [float(wait) for wait in re.findall(r"fleet_publish_retry \S+ retry_in_s=([\d.]+)", log)]


def test_pages_say_unavailable_while_valkey_is_down_and_go_live_again_without_reconnecting(
    outage: tuple[Outage, FleetWeb],
) -> None:
    """GIVEN olivia in two tabs and audrey watching live snapshots
    WHEN Valkey stops, a new tab opens during the outage, and Valkey starts again (empty) on
    the same port with the fleet written anew
    THEN every open socket gets one "unavailable" status and stays open; the new tab is
    accepted and told "unavailable" (not dropped); the publisher keeps running, logging the
    outage and retrying with growing waits; once Valkey is back every socket — the same
    connection, no reconnect — gets "available" then a snapshot of the new fleet; and the
    publisher logs its recovery."""
    store, web = outage
    olivia, audrey = session_cookie(web.url, "olivia"), session_cookie(web.url, "audrey")
    assert web.publisher is not None
    publisher = web.publisher

    async def scenario() -> None:
        sockets = [
            await _connect(web.url, olivia),
            await _connect(web.url, olivia),
            await _connect(web.url, audrey),
        ]
        try:
            for socket in sockets:
                assert _running(await _next_snapshot(socket)) == 3

            await asyncio.to_thread(store.stop)
            for socket in sockets:
                before = await _until_status(socket, "unavailable")
                assert "Valkey" in before[-1]["detail"]

            # A tab opened during the outage: accepted, told at once, kept open.
            late = await _connect(web.url, olivia)
            sockets.append(late)
            first = await _next(late)
            assert first["status"] == "unavailable"

            # The publisher lives on and backs off (several tries, the waits growing).
            assert await asyncio.to_thread(
                wait_until, lambda: len(_retry_waits(publisher.log_text())) >= 4, WAIT_S
            )
            assert publisher.alive()
            log = publisher.log_text()
            assert log.count("fleet_valkey_unavailable") == 1
            waits = _retry_waits(log)
            assert waits[:4] == sorted(waits[:4])
            assert waits[3] > waits[0]
            # The page itself still answers (with no picture to start from).
            page = await asyncio.to_thread(
                httpx.get, f"{web.url}/fleet/", cookies={"sessionid": olivia}, timeout=10
            )
            assert page.status_code == 200
            assert 'id="fleet-notice"' in page.text

            await asyncio.to_thread(store.start, running=9)
            for socket in sockets:
                messages = await _until_status(socket, "available")
                assert all(m.get("status") != "unavailable" for m in messages[1:]), messages
                await _until_running(socket, 9)
            # ... and keep ticking on the same connections.
            for socket in sockets:
                assert _running(await _next_snapshot(socket)) == 9
            assert "fleet_valkey_recovered" in publisher.log_text()
            assert publisher.alive()
        finally:
            for socket in sockets:
                await socket.close()

    asyncio.run(scenario())


def test_a_second_outage_is_reported_again(outage: tuple[Outage, FleetWeb]) -> None:
    """GIVEN olivia watching, through one outage and back
    WHEN Valkey goes away a second time
    THEN she is told "unavailable" again and "available" again after it: the consumer's
    recovery leaves it watching for the next outage, not for the last one only."""
    store, web = outage
    olivia = session_cookie(web.url, "olivia")

    async def scenario() -> None:
        socket = await _connect(web.url, olivia)
        try:
            await _next_snapshot(socket)
            for running in (4, 5):
                await asyncio.to_thread(store.stop)
                await _until_status(socket, "unavailable")
                await asyncio.to_thread(store.start, running=running)
                await _until_status(socket, "available")
                await _until_running(socket, running)
        finally:
            await socket.close()

    asyncio.run(scenario())
