"""Scheduling and admission tests run against the session's real valkey-server.

``async def`` tests are run here with ``asyncio.run`` (bounded by a timeout), so no asyncio
plugin is needed; each test gets a flushed database through ``valkey_client``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
import valkey
import valkey.asyncio as avalkey

from gateway.scheduling import Scheduler, fleet_entry, keys, lua_source, wall_ms, write_fleet

ASYNC_TEST_TIMEOUT_S = 20.0

MODEL = "llama"
R1 = "http://10.0.0.1:8000"
R2 = "http://10.0.0.2:8000"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = inspect.signature(pyfuncitem.obj).parameters
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    asyncio.run(asyncio.wait_for(pyfuncitem.obj(**kwargs), ASYNC_TEST_TIMEOUT_S))
    return True


@pytest.fixture
def db(valkey_client: valkey.Valkey) -> valkey.Valkey:
    """A flushed database, for tests that call the Lua scripts directly."""
    return valkey_client


class Lua:
    """The scheduling scripts, called directly with their raw KEYS and ARGV."""

    def __init__(self, client: valkey.Valkey) -> None:
        self.client = client
        self._scripts = {
            name: client.register_script(lua_source(name))
            for name in ("acquire", "release", "pump", "cancel", "reap", "renew")
        }

    def __call__(self, name: str, *args: Any, model: str = MODEL, tenant: str = "") -> Any:
        """``model``: whose pool's slot the script runs on (KEYS[1]); ``tenant``: acquire's
        KEYS[2], the tenant's slot."""
        slots = [keys.pool_prefix(model)] + ([keys.account_prefix(tenant)] if tenant else [])
        return self._scripts[name](keys=slots, args=list(args))

    def acquire(
        self,
        now: int,
        request_id: str,
        *,
        model: str = MODEL,
        rank: int = 1,
        priority_class: str = "prod",
        max_queue: int = 1000,
        tenant: str = "acme",
        use_case: str = "1",
        max_concurrent: int = 0,
        cost: int = 100,
        prefix_hash: str = "",
        lease_ms: int = 30_000,
        gateway: str = "gw-a",
        deadline: int | None = None,
        stale_ms: int = 1_000,
        threshold: int = 3,
        replicas: Sequence[tuple[str, int]] = ((R1, 1),),
        limits: Sequence[tuple[str, str, int, int, int]] = (),  # stem, kind, window, limit, cost
        pool_share: int = 1000,
        long: bool = False,
        lanes: bool = False,
    ) -> list[Any]:
        """``limits``: (id, kind, window_ms, limit, cost) each, as limits.lua takes them;
        ``pool_share``: the class's share of the pool in thousandths (1000: all); ``long``:
        a long prompt, ``lanes``: the pool keeps long prompts apart (common.lua pick)."""
        args: list[Any] = [
            now, request_id, model, rank, priority_class, max_queue, tenant, use_case,
            max_concurrent, pool_share, cost, prefix_hash, "1" if long else "0", lease_ms,
            gateway, deadline if deadline is not None else now + 60_000, stale_ms, threshold,
            "1" if lanes else "0", len(replicas),
        ]  # fmt: skip
        for url, cap in replicas:
            args += [url, cap]
        for limit in limits:
            args += list(limit)
        return [_text(v) for v in self("acquire", *args, model=model, tenant=tenant)]

    def release(
        self,
        now: int,
        request_id: str,
        model: str = MODEL,
        reconcile: Sequence[tuple[str, int, int, int]] = (),
    ) -> list[int]:
        """[released, granted, windows adjusted]; ``reconcile``: (id, window_ms, window
        index, delta) each (limits.lua)."""
        args: list[Any] = [now, request_id, model]
        for window in reconcile:
            args += list(window)
        return [int(v) for v in self("release", *args, model=model)]

    def cancel(self, now: int, request_id: str, *, keep: bool = False, model: str = MODEL):
        return [
            _text(v)
            for v in self("cancel", now, request_id, model, "1" if keep else "0", model=model)
        ]

    def fleet(
        self,
        now: int,
        *entries: tuple[str, int],
        model: str = MODEL,
        in_flight: int | None = None,
        max_running: int = 0,
    ) -> None:
        """Fresh metrics for each (replica, waiting) at ``now``; ``in_flight``: the pool's
        count on the replica when the scrape began, ``max_running``: its learned batch size
        (as the fleet watcher writes them)."""
        self.client.hset(
            keys.fleet(model),
            mapping={
                url: fleet_entry(
                    waiting=waiting,
                    running=0,
                    kv_usage=0.1,
                    scraped_at_ms=now,
                    in_flight=in_flight,
                    max_running=max_running,
                )
                for url, waiting in entries
            },
        )

    def heartbeat(self, gateway: str, expiry_ms: int, model: str = MODEL) -> None:
        """What Scheduler.heartbeat writes: ``gateway`` is alive until ``expiry_ms`` (in
        ``model``'s pool)."""
        self.client.zadd(keys.gateways(model), {gateway: expiry_ms})

    def in_flight(self, model: str = MODEL) -> dict[str, int]:
        return {_text(k): int(v) for k, v in self.client.hgetall(keys.in_flight(model)).items()}

    def queue(self, model: str = MODEL) -> list[str]:
        return [_text(m) for m in self.client.zrange(keys.queue(model), 0, -1)]


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


@pytest.fixture
def lua(db: valkey.Valkey) -> Lua:
    return Lua(db)


# A heartbeat that never expires within a test driven by the caller's clock.
FOREVER_MS = 2**52


async def write_fresh_fleet(
    client: avalkey.Valkey, replicas: Sequence[str], *, waiting: int = 0, model: str = MODEL
) -> None:
    now = wall_ms()
    entry = fleet_entry(waiting=waiting, running=0, kv_usage=0.1, scraped_at_ms=now)
    await write_fleet(client, model, dict.fromkeys(replicas, entry))


@asynccontextmanager
async def running_schedulers(
    url: str, count: int = 1, **options: Any
) -> AsyncIterator[list[Scheduler]]:
    """``count`` started schedulers, each with its own client and gateway id, like separate
    gateway processes sharing one Valkey. Fleet metrics written once stay fresh for a minute
    unless a test sets ``stale_ms`` (no watcher runs here)."""
    options.setdefault("stale_ms", 60_000)
    clients = [avalkey.Valkey.from_url(url) for _ in range(count)]
    schedulers = [
        Scheduler(client, gateway_id=f"gw-{i}", **options) for i, client in enumerate(clients)
    ]
    try:
        for scheduler in schedulers:
            await scheduler.start()
        yield schedulers
    finally:
        for scheduler in schedulers:
            await scheduler.close()
        for client in clients:
            await client.aclose()


async def eventually(predicate: Any, *, timeout_s: float = 5.0, message: str = "") -> None:
    """Poll an (async) predicate until true; the state it waits for comes from elsewhere."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(message or "condition not reached in time")
        await asyncio.sleep(0.005)
