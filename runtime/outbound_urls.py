"""Where Switchyard may send a request a tenant named: use case webhooks and async tasks'
``callback_url`` (issue 24, defect 5).

Such a URL makes the server send a request on a tenant's say-so, so it must not reach what
only the server can reach: loopback (on ``make up``, SeaweedFS's filer takes unauthenticated
writes there), private and shared (CGNAT) networks, link-local (the cloud metadata service at
169.254.169.254), multicast, unspecified and reserved addresses — in any spelling: IPv6 forms
that carry an IPv4 address (mapped, NAT64, 6to4), and the decimal, hex, octal and short IPv4
forms that ``inet_aton`` (and so ``getaddrinfo``) accepts, such as ``http://0x7f000001/``.

The rule: resolve the host once; refuse if ANY of its addresses is forbidden; then connect to
the address that was checked, sending the URL's host in ``Host`` and in TLS's SNI, so that a
name cannot resolve somewhere else between the check and the connection (DNS rebinding). No
redirect is followed. An operator who needs an internal receiver names its networks in
``SWITCHYARD_WEBHOOK_ALLOWED_NETWORKS`` (comma-separated CIDRs; empty by default).

Checked where a URL is registered (a clear 400; a name that does not resolve yet is taken)
and again before each send (what a name resolves to can change). Part of config's floor so
that the gateway's async door and the scheduler's senders share this one rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import ipaddress
import socket
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from runtime.env import ConfigurationError, env_list

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOWED_NETWORKS_VARIABLE: Final = "SWITCHYARD_WEBHOOK_ALLOWED_NETWORKS"
# How long a registration waits for a name to resolve before taking it unchecked (the send
# checks it again); the gateway's submit must not hang on a slow resolver.
REGISTRATION_RESOLVE_TIMEOUT_S: Final = 2.0

_SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # RFC 6598, carrier-grade NAT
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: the low 32 bits are IPv4
_HINT = (
    "Switchyard does not call internal addresses (an operator may allow a network with "
    f"{ALLOWED_NETWORKS_VARIABLE})"
)


class OutboundRefused(ValueError):
    """A URL Switchyard will not call; the message completes "The URL …" (no full stop)."""


class HostUnresolved(Exception):
    """The URL's host has no address now (it may later): retried at send time."""


class SendFailed(Exception):
    """No HTTP answer: the connection, TLS or the exchange failed."""


@dataclass(frozen=True, slots=True)
class Destination:
    """A URL taken apart as it will be called."""

    scheme: str  # "http" or "https"
    host: str  # as in the URL: lower case, IPv6 without brackets; sent in Host and SNI
    port: int
    target: str  # the request line's path and query


@dataclass(frozen=True, slots=True)
class Resolved:
    """A destination and the one checked address that is connected to."""

    destination: Destination
    address: str


def parse_networks(items: Iterable[str]) -> tuple[Network, ...]:
    """The allow-list: CIDRs (a bare address is one host); ConfigurationError on a bad one."""
    networks: list[Network] = []
    for item in items:
        text = item.strip()
        if not text:
            continue
        try:
            networks.append(ipaddress.ip_network(text))
        except ValueError as exc:
            raise ConfigurationError(
                f"{ALLOWED_NETWORKS_VARIABLE}: {text!r} is not a network in CIDR form "
                f"(e.g. 10.20.0.0/16 or fd00::/8): {exc}"
            ) from exc
    return tuple(networks)


def allowed_networks_from_env() -> tuple[Network, ...]:
    """What the operator allows, read by both the Django settings and the gateway's."""
    return parse_networks(env_list("SWITCHYARD_WEBHOOK_ALLOWED_NETWORKS", []))


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one reaches: mapped (::ffff:a.b.c.d), NAT64, 6to4, Teredo."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def _kind(address: Address) -> str | None:
    """What makes ``address`` internal ("a loopback address"), or None for a public one."""
    if address.is_loopback:
        return "a loopback address"
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_link_local:
        return "a link-local address (where the cloud metadata service lives)"
    if address.is_multicast:
        return "a multicast address"
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return "a shared address (carrier-grade NAT, 100.64.0.0/10)"
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        return "a site-local address"
    if address.is_private:
        return "a private address"
    if address.is_reserved:
        return "a reserved address"
    if not address.is_global:
        return "an address that is not globally routable"
    return None


def forbidden_reason(address: Address, allowed: Sequence[Network] = ()) -> str | None:
    """Why Switchyard may not connect to ``address``, or None when it may. An IPv6 address
    that carries an IPv4 one (mapped, NAT64, 6to4, Teredo) reaches that one: it decides."""
    embedded = _embedded_ipv4(address) if isinstance(address, ipaddress.IPv6Address) else None
    if any(address in net or (embedded is not None and embedded in net) for net in allowed):
        return None
    if embedded is not None:
        inner = _kind(embedded)
        return None if inner is None else f"an IPv6 form of {inner}"
    return _kind(address)


def _ipv4_part(text: str) -> int | None:
    if text[:2].lower() == "0x":
        digits, base = text[2:], 16
    elif len(text) > 1 and text[0] == "0":
        digits, base = text[1:], 8
    else:
        digits, base = text, 10
    if not digits:
        return 0 if base == 16 else None  # inet_aton reads a bare "0x" as 0
    try:
        return int(digits, base) if digits.isalnum() and digits.isascii() else None
    except ValueError:
        return None


def _ipv4_literal(host: str) -> ipaddress.IPv4Address | None:
    """``host`` as inet_aton reads it: one to four dot-separated numbers, each decimal, hex
    (0x) or octal (leading 0), the last filling the remaining bytes (127.1 is 127.0.0.1)."""
    parts = host.split(".")
    if len(parts) > 4 or any(not part for part in parts):
        return None
    numbers = [_ipv4_part(part) for part in parts]
    if any(number is None for number in numbers):
        return None
    *head, last = [number for number in numbers if number is not None]
    if any(number > 0xFF for number in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    value = last
    for index, number in enumerate(head):
        value |= number << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def literal_address(host: str) -> Address | None:
    """The address ``host`` spells without asking DNS (a trailing dot is ignored), or None."""
    bare = host[:-1] if host.endswith(".") else host
    if ":" in bare:
        try:
            return ipaddress.IPv6Address(bare)
        except ValueError:
            return None
    return _ipv4_literal(bare)


def destination(url: str) -> Destination:
    """``url`` taken apart; OutboundRefused unless it is a plain http(s) URL with a host."""
    if not url.isascii() or any(ord(char) <= 0x20 or ord(char) == 0x7F for char in url):
        raise OutboundRefused(
            "must be plain ASCII without spaces or control characters (write an international "
            "name in its xn-- form, and percent-encode the path)"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OutboundRefused("must be http:// or https:// with a host")
    if parts.username is not None or parts.password is not None:
        raise OutboundRefused("must not carry a user name or password")
    try:
        port = parts.port
    except ValueError:
        raise OutboundRefused("has a port that is not a number from 1 to 65535") from None
    if port == 0:
        raise OutboundRefused("has a port that is not a number from 1 to 65535")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    default = 443 if parts.scheme == "https" else 80
    return Destination(parts.scheme, parts.hostname, port or default, target)


def _check(addresses: Sequence[Address], allowed: Sequence[Network], *, named: bool) -> None:
    for address in addresses:
        reason = forbidden_reason(address, allowed)
        if reason is None:
            continue
        # A name's addresses are not told back: they may be an internal network's.
        where = "its host resolves to" if named else f"{address} is"
        raise OutboundRefused(f"is refused: {where} {reason}. {_HINT}")


def _addresses(infos: Iterable[tuple[Any, Any, Any, Any, tuple[Any, ...]]]) -> list[Address]:
    # An IPv6 link-local answer keeps its zone ("fe80::1%eth0"): ipaddress reads it.
    return [ipaddress.ip_address(str(info[4][0])) for info in infos]


def _lookup_name(host: str) -> str:
    return host[:-1] if host.endswith(".") else host


def resolve(url: str, allowed: Sequence[Network]) -> Resolved:
    """The checked address to connect to for ``url`` (blocking: a worker's or a view's call).
    OutboundRefused if any address is forbidden; HostUnresolved if the name has none."""
    place = destination(url)
    literal = literal_address(place.host)
    if literal is not None:
        _check([literal], allowed, named=False)
        return Resolved(place, str(literal))
    try:
        infos = socket.getaddrinfo(_lookup_name(place.host), place.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise HostUnresolved(f"{place.host} does not resolve: {exc}") from exc
    return _resolved(place, _addresses(infos), allowed)


def _resolved(place: Destination, found: list[Address], allowed: Sequence[Network]) -> Resolved:
    if not found:
        raise HostUnresolved(f"{place.host} has no address")
    _check(found, allowed, named=True)
    return Resolved(place, str(found[0]))


async def resolve_async(url: str, allowed: Sequence[Network]) -> Resolved:
    """``resolve`` for an event loop: the lookup runs in the loop's resolver threads (bound
    it with ``asyncio.timeout``)."""
    place = destination(url)
    literal = literal_address(place.host)
    if literal is not None:
        _check([literal], allowed, named=False)
        return Resolved(place, str(literal))
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(
            _lookup_name(place.host), place.port, type=socket.SOCK_STREAM
        )
    except (OSError, UnicodeError) as exc:
        raise HostUnresolved(f"{place.host} does not resolve: {exc}") from exc
    return _resolved(place, _addresses(infos), allowed)


def check_at_registration(url: str, allowed: Sequence[Network]) -> None:
    """OutboundRefused for a URL that may not be saved; a name that does not resolve yet is
    taken (its receiver may not be set up): the send checks again."""
    with contextlib.suppress(HostUnresolved):
        resolve(url, allowed)


async def check_at_registration_async(url: str, allowed: Sequence[Network]) -> None:
    """``check_at_registration`` for an event loop; a lookup slower than
    REGISTRATION_RESOLVE_TIMEOUT_S is taken as not resolving yet."""
    with contextlib.suppress(HostUnresolved, TimeoutError):
        async with asyncio.timeout(REGISTRATION_RESOLVE_TIMEOUT_S):
            await resolve_async(url, allowed)


# --- the connection: to the checked address, the URL's own Host and SNI ------------------
class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, resolved: Resolved, timeout: float) -> None:
        super().__init__(resolved.destination.host, resolved.destination.port, timeout=timeout)
        self._address = resolved.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, resolved: Resolved, timeout: float) -> None:
        context = _tls_context()
        place = resolved.destination
        super().__init__(place.host, place.port, timeout=timeout, context=context)
        self._address = resolved.address
        self._tls = context

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        try:
            self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise


def _tls_context() -> ssl.SSLContext:
    # The system's trust store, read per connection (webhooks are few; SSL_CERT_FILE and
    # SSL_CERT_DIR are honoured): the certificate and name are verified against the URL's
    # host, never against the address connected to.
    return ssl.create_default_context()


def post(resolved: Resolved, body: bytes, headers: Mapping[str, str], *, timeout: float) -> int:
    """POST ``body`` to the checked address as ``resolved``'s URL; the status (a redirect is
    an answer like any other: never followed). SendFailed when there is no HTTP answer."""
    connection: http.client.HTTPConnection = (
        _PinnedHTTPSConnection(resolved, timeout)
        if resolved.destination.scheme == "https"
        else _PinnedHTTPConnection(resolved, timeout)
    )
    try:
        connection.request("POST", resolved.destination.target, body=body, headers=dict(headers))
        answer = connection.getresponse()
        answer.read(64 * 1024)  # the receiver's words are not used; a bounded read
        return answer.status
    except (OSError, http.client.HTTPException) as exc:
        raise SendFailed(type(exc).__name__) from exc
    finally:
        connection.close()
