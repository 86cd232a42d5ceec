"""The fleet client: one pooled aiohttp session with explicit limits and timeouts."""

from __future__ import annotations

import logging

import aiohttp

logger = logging.getLogger(__name__)

# Errors that prove the replica never started on the request: safe to try another one.
_CONNECT_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError)


class Upstream:
    def __init__(self, *, connect_timeout_s: float, max_connections: int) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

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

    async def post(
        self, replica: str, path: str, body: bytes, headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        """Send to the replica the scheduler granted; the caller must close the response.

        Raises ReplicaUnreachable when the replica never started on the request (refused or
        dropped before answering), so the caller may safely try another one.
        """
        assert self._session is not None, "Upstream.start() was not awaited"
        try:
            return await self._session.post(replica + path, data=body, headers=headers)
        except _CONNECT_ERRORS as exc:
            logger.warning(
                "upstream_unreachable replica=%s error=%s", replica, exc.__class__.__name__
            )
            raise ReplicaUnreachable(replica) from exc


class ReplicaUnreachable(Exception):
    """The replica did not take the request; nothing reached vLLM, so retrying is safe."""

    def __init__(self, replica: str) -> None:
        super().__init__(replica)
        self.replica = replica
