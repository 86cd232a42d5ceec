"""The ceiling the gateway is measured against: a relay with the same stack and no logic.

    .venv/bin/python -m bench.gateway.bare_relay --port 9000 --upstream http://127.0.0.1:8000 \
        [--client aiohttp|switchyard]

Raw ASGI on uvicorn + uvloop + httptools, and one pooled upstream client:

- ``aiohttp`` (the default): one aiohttp ClientSession. This is the issue's reference relay,
  the one the throughput target's share is defined against.
- ``switchyard``: the gateway's own fleet client (``gateway.upstream.Upstream``) with the
  gateway's default pool settings, relaying the answer as the gateway does (the replica's
  Content-Length kept, the last bytes ending the response), so that the gateway and this
  relay differ only in the gateway's own work. That client speaks POST only: ``GET /health``
  is answered by the relay itself and any other method gets 405.

Every request is forwarded as is (method, path, query, body, content type) to the one
upstream, and the answer relayed chunk by chunk, so an SSE stream is relayed as it arrives.
No authentication, no parsing, no routing, no watch for client disconnects, no error mapping
(an upstream failure is uvicorn's 500, which wrk counts): whatever the gateway costs beyond
this is the price of its own work.
"""

from __future__ import annotations

import abc
import argparse

import aiohttp
import uvicorn

from gateway.upstream import Upstream
from runtime.http import ClientGone, Receive, Scope, Send, header, read_body

# The gateway's default pool shape (gateway/settings.py), so the two differ only in logic.
MAX_CONNECTIONS = 1000
CONNECT_TIMEOUT_S = 2.0
TOTAL_TIMEOUT_S = 60.0
CLIENTS = ("aiohttp", "switchyard")
MAX_BODY_BYTES = 64 * 1024 * 1024  # far above any benchmark request


class BareRelay(abc.ABC):
    """The ASGI plumbing both relays share: lifespan opens and closes the client."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.relay(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def relay(self, scope: Scope, receive: Receive, send: Send) -> None: ...


class AiohttpRelay(BareRelay):
    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=MAX_CONNECTIONS, limit_per_host=0, keepalive_timeout=30
            ),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            timeout=aiohttp.ClientTimeout(total=TOTAL_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def relay(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self._session is not None, "lifespan startup has not run"
        body = await _body(receive)
        if body is None:
            return
        url = self.upstream + _path(scope)
        headers = {"content-type": (header(scope, b"content-type") or b"application/json").decode()}
        async with self._session.request(
            scope["method"], url, data=body, headers=headers
        ) as response:
            content_type = response.headers.get("content-type", "application/json")
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status,
                    "headers": [(b"content-type", content_type.encode())],
                }
            )
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})


class SwitchyardRelay(BareRelay):
    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self._client = Upstream(
            connect_timeout_s=CONNECT_TIMEOUT_S, max_connections=MAX_CONNECTIONS
        )

    async def start(self) -> None:
        await self._client.start()

    async def close(self) -> None:
        await self._client.close()

    async def relay(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            status = 200 if scope["method"] == "GET" and scope["path"] == "/health" else 405
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body = await _body(receive)
        if body is None:
            return
        content_type = header(scope, b"content-type") or b"application/json"
        response = await self._client.post(
            self.upstream, _path(scope), body, [(b"content-type", content_type)]
        )
        try:
            headers = [(b"content-type", response.content_type)]
            if response.content_length is not None:
                headers.append((b"content-length", response.content_length))
            await send(
                {"type": "http.response.start", "status": response.status, "headers": headers}
            )
            # As the gateway relays (gateway/app.py): the last bytes end the response.
            more = True
            while more and (chunk := await response.read()):
                more = not response.done
                await send({"type": "http.response.body", "body": chunk, "more_body": more})
            if more:
                await send({"type": "http.response.body", "body": b""})
        finally:
            response.close()


async def _body(receive: Receive) -> bytes | None:
    """The request body, or None when the client left before it finished sending."""
    try:
        return await read_body(receive, MAX_BODY_BYTES)
    except ClientGone:
        return None


def _path(scope: Scope) -> str:
    path: str = scope["path"]
    if scope["query_string"]:
        path += "?" + scope["query_string"].decode("latin-1")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--client", choices=CLIENTS, default="aiohttp", help="the pooled upstream client"
    )
    args = parser.parse_args()
    relay = AiohttpRelay if args.client == "aiohttp" else SwitchyardRelay
    uvicorn.run(
        relay(args.upstream),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
