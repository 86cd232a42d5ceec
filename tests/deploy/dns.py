"""A real DNS server on loopback (dnslib's), serving a zone the test changes as it goes:
what a headless Service's name answers as its pods come and go."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from dnslib import AAAA, QTYPE, RCODE, RR, A, DNSRecord  # type: ignore[import-untyped]
from dnslib.server import (  # type: ignore[import-untyped]
    BaseResolver,
    DNSHandler,
    DNSServer,
)


class Zone(BaseResolver):  # type: ignore[misc]
    """Name → addresses (IPv4 and IPv6 mixed); a name not in it is NXDOMAIN."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, list[str]] = {}

    def set(self, name: str, *addresses: str) -> None:
        with self._lock:
            self._names[name.rstrip(".")] = list(addresses)

    def remove(self, name: str) -> None:
        with self._lock:
            self._names.pop(name.rstrip("."), None)

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        reply = request.reply()
        qname = str(request.q.qname).rstrip(".")
        with self._lock:
            addresses = self._names.get(qname)
        if addresses is None:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        for address in addresses:
            if request.q.qtype == QTYPE.A and ":" not in address:
                reply.add_answer(RR(qname, QTYPE.A, rdata=A(address), ttl=1))
            elif request.q.qtype == QTYPE.AAAA and ":" in address:
                reply.add_answer(RR(qname, QTYPE.AAAA, rdata=AAAA(address), ttl=1))
        return reply


class _Quiet:
    """dnslib logs every query to stdout by default."""

    def __getattr__(self, name: str) -> object:
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def dns_server(zone: Zone) -> Iterator[DNSServer]:
    """The zone served over UDP on 127.0.0.1, on a port the OS picks: ``nameserver(server)``."""
    server = DNSServer(zone, port=0, address="127.0.0.1", logger=_Quiet())
    server.start_thread()
    try:
        yield server
    finally:
        server.stop()
        server.server.server_close()


def nameserver(server: DNSServer) -> str:
    host, port = server.server.server_address[:2]
    return f"{host}:{port}"
