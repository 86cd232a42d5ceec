"""The fleet client: one pooled aiohttp session, replica choice, failover before first byte."""

from __future__ import annotations

import itertools
import logging

import aiohttp

from gateway.errors import GatewayError
from gateway.policy import Model

logger = logging.getLogger(__name__)

# Errors that prove the replica never started on the request: safe to try another one.
_CONNECT_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError)


class Upstream:
    def __init__(self, *, connect_timeout_s: float, max_connections: int) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self.in_flight: dict[str, int] = {}
        self._rotation = itertools.count()

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._max_connections, limit_per_host=0, keepalive_timeout=30, ttl_dns_cache=300
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,  # pass bytes through untouched
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def replicas_in_order(self, model: Model) -> list[str]:
        """Least in-flight first; ties rotate so equal replicas share the load."""
        replicas = list(model.replicas)
        if len(replicas) > 1:
            shift = next(self._rotation) % len(replicas)
            replicas = replicas[shift:] + replicas[:shift]
            replicas.sort(key=lambda url: self.in_flight.get(url, 0))
        return replicas

    async def post(
        self, model: Model, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[str, aiohttp.ClientResponse]:
        """Send to the first replica that accepts the connection; the caller must release it."""
        assert self._session is not None, "Upstream.start() was not awaited"
        last_error: Exception | None = None
        for replica in self.replicas_in_order(model):
            try:
                self.in_flight[replica] = self.in_flight.get(replica, 0) + 1
                response = await self._session.post(replica + path, data=body, headers=headers)
            except _CONNECT_ERRORS as exc:
                self.in_flight[replica] -= 1
                last_error = exc
                logger.warning(
                    "upstream_failover replica=%s error=%s", replica, exc.__class__.__name__
                )
                continue
            except BaseException:
                self.in_flight[replica] -= 1
                raise
            return replica, response
        raise GatewayError(
            502,
            f"No replica of model {model.public_id!r} could be reached.",
            type="api_error",
            code="upstream_unavailable",
        ) from last_error

    def done(self, replica: str) -> None:
        self.in_flight[replica] -= 1
