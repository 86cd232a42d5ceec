"""A TCP proxy in front of a real valkey-server that loses one reply: the command reached the
server and ran, and the connection died before its answer came back — what a node dying or a
network cut between the write and the reply looks like to a client. No real part can be made
to fail at exactly that instant on demand, so this is the one fault injected by hand."""

from __future__ import annotations

import asyncio
import contextlib


class ReplyLosingProxy:
    """Forwards everything between clients and ``127.0.0.1:upstream_port`` until armed; then,
    for the first client write that contains ``marker``, forwards the write, swallows the
    server's reply and closes both connections (``ran=False``: drops the write itself, so the
    command never ran; ``then_down``: stops listening too, as a node that died). Run inside
    the test's event loop."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream_port = upstream_port
        self._marker: bytes | None = None
        self._forward = True
        self._then_down = False
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self.lost = asyncio.Event()  # set once a reply was swallowed

    async def start(self) -> int:
        """Listen on a free port of 127.0.0.1; that port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def arm(self, marker: bytes, *, ran: bool = True, then_down: bool = False) -> None:
        self._marker, self._forward, self._then_down = marker, ran, then_down

    def _lose(self) -> None:
        self._marker = None
        self.lost.set()
        if self._then_down and self._server is not None:
            self._server.close()

    async def close(self) -> None:
        for writer in list(self._connections):
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self._upstream_port)
        self._connections |= {client_w, server_w}
        cut = asyncio.Event()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                armed = self._marker is not None and self._marker in data
                if armed and not self._forward:
                    self._lose()
                    return
                server_w.write(data)
                await server_w.drain()
                if armed:
                    self._marker = None
                    cut.set()

        async def downstream() -> None:
            while data := await server_r.read(65536):
                if cut.is_set():  # the armed command's reply: it ran; the client never hears
                    self._lose()
                    return
                client_w.write(data)
                await client_w.drain()

        pumps = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        with contextlib.suppress(ConnectionError):
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        for writer in (client_w, server_w):
            writer.close()
            self._connections.discard(writer)
