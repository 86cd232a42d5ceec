"""vLLM replicas by Kubernetes service discovery: a headless Service's name instead of URLs.

A deployment's replica may be given as ``dns+http://<name>:<port>`` (or ``dns+https://``),
e.g. ``dns+http://vllm-llama.inference.svc.cluster.local:8000``: a headless Service, whose
name resolves to the address of every ready pod behind it (A and AAAA records). The policy
store (gateway/policy_store.py) of each gateway, batcher and fleet watcher keeps the
published policy as governance wrote it, and serves requests an expanded copy in which each
such name stands for ``http://<address>:<port>`` per address found. Names are resolved off
the request path, when the policy is refreshed and at most every ``refresh_s``; the expanded
copy is rebuilt only when an answer changed, so ``PolicyStore.current()`` stays a field read.

Failure is not mistaken for an empty fleet: a lookup that times out or fails keeps the last
addresses found (logged); only an answer that the name has no addresses (NXDOMAIN, or no A
and no AAAA record: a Service with no ready pod) empties it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Final
from urllib.parse import urlsplit

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver

from gateway.policy import Model, Policy
from runtime.env import env_float, env_str

logger = logging.getLogger("gateway.discovery")

SCHEMES: Final = {"dns+http": "http", "dns+https": "https"}
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def is_service_name(replica: str) -> bool:
    """Whether a replica entry names a Service to resolve rather than one replica."""
    return replica.startswith(("dns+http://", "dns+https://"))


@dataclass(frozen=True, slots=True)
class ServiceName:
    """A ``dns+http(s)://host[:port][/path]`` replica entry, parsed."""

    url: str
    scheme: str  # the replicas' scheme: http or https
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> ServiceName:
        """Raises ValueError on anything but a dns+http(s) URL with a host."""
        parts = urlsplit(url)
        scheme = SCHEMES.get(parts.scheme)
        if scheme is None or not parts.hostname:
            raise ValueError(f"{url!r} is not a dns+http(s):// service name with a host")
        port = parts.port or _DEFAULT_PORTS[scheme]
        return cls(url, scheme, parts.hostname, port, parts.path.rstrip("/"))

    def replica(self, address: str) -> str:
        host = f"[{address}]" if ":" in address else address
        return f"{self.scheme}://{host}:{self.port}{self.path}"


@dataclass(frozen=True, slots=True)
class DiscoverySettings:
    refresh_s: float = 5.0
    # The DNS server to ask, an address with an optional port; empty: the system's (resolv.conf,
    # which in a pod is the cluster DNS with the namespace's search domains).
    nameserver: str = ""
    timeout_s: float = 2.0

    @classmethod
    def from_env(cls) -> DiscoverySettings:
        return cls(
            refresh_s=env_float("SWITCHYARD_DISCOVERY_REFRESH_SECONDS", 5.0, minimum=0.05),
            nameserver=env_str("SWITCHYARD_DISCOVERY_NAMESERVER", ""),
            timeout_s=env_float("SWITCHYARD_DISCOVERY_TIMEOUT_SECONDS", 2.0, minimum=0.05),
        )


def _nameserver(text: str) -> tuple[str, int]:
    """ "10.96.0.10", "10.96.0.10:5353", "fd00::10" or "[fd00::10]:5353": (address, port)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    return host, int(port) if port else 53


def _resolver(settings: DiscoverySettings) -> dns.asyncresolver.Resolver:
    if settings.nameserver:
        host, port = _nameserver(settings.nameserver)
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [dns.nameserver.Do53Nameserver(host, port=port)]
    else:
        resolver = dns.asyncresolver.Resolver()
    resolver.lifetime = settings.timeout_s
    resolver.timeout = settings.timeout_s
    return resolver


class ReplicaDiscovery:
    """The addresses behind every service name of a policy, and the policy expanded by them."""

    def __init__(
        self,
        settings: DiscoverySettings | None = None,
        resolver: dns.asyncresolver.Resolver | None = None,
    ) -> None:
        self.settings = settings or DiscoverySettings()
        self._resolver = resolver
        self._replicas: dict[str, tuple[str, ...]] = {}  # service name → replica URLs
        self._resolved_at: dict[str, float] = {}  # service name → monotonic time of the try

    def replicas(self, service: str) -> tuple[str, ...]:
        """The replica URLs last found behind ``service`` (none before its first answer)."""
        return self._replicas.get(service, ())

    async def refresh(self, services: Iterable[str]) -> bool:
        """Resolve the names never resolved or not for ``refresh_s``; whether any changed.
        Names no longer asked for are forgotten."""
        wanted = set(services)
        for gone in self._replicas.keys() - wanted:
            del self._replicas[gone]
            self._resolved_at.pop(gone, None)
        now = time.monotonic()
        due = sorted(
            name
            for name in wanted
            if now - self._resolved_at.get(name, -float("inf")) >= self.settings.refresh_s
        )
        if not due:
            return False
        if self._resolver is None:
            self._resolver = _resolver(self.settings)
        answers = await asyncio.gather(*map(self._lookup, due))
        changed = False
        for name, found in zip(due, answers, strict=True):
            self._resolved_at[name] = now
            if found is None or found == self._replicas.get(name):
                continue
            logger.info(
                "service_replicas_changed service=%s replicas=%s", name, ",".join(found) or "-"
            )
            self._replicas[name] = found
            changed = True
        return changed

    async def _lookup(self, name: str) -> tuple[str, ...] | None:
        """Every address behind the name as a replica URL, sorted; None when the lookup
        failed (keep what was known)."""
        assert self._resolver is not None
        try:
            service = ServiceName.parse(name)
        except ValueError as exc:  # governance refuses these; an old snapshot may hold one
            logger.error("service_name_invalid error=%s", exc)
            return ()
        results = await asyncio.gather(
            *(self._addresses(service.host, kind) for kind in ("A", "AAAA")),
            return_exceptions=True,
        )
        addresses: set[str] = set()
        for result in results:
            if isinstance(result, BaseException):
                logger.warning(
                    "service_lookup_failed service=%s error=%s kept=%s",
                    service.url,
                    result.__class__.__name__,
                    len(self._replicas.get(service.url, ())),
                )
                return None
            addresses |= result
        return tuple(sorted(service.replica(address) for address in addresses))

    async def _addresses(self, host: str, kind: str) -> set[str]:
        assert self._resolver is not None
        try:
            answer = await self._resolver.resolve(host, kind, search=True)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return set()  # the name has no such address: a Service without ready pods
        return {record.to_text() for record in answer}

    def expand(self, policy: Policy) -> Policy:
        """``policy`` with every service name replaced by the replicas found behind it."""
        models = dict(policy.models)
        changed = False
        for public_id, model in policy.models.items():
            if any(is_service_name(replica) for replica in model.replicas):
                models[public_id] = self._expand_model(model)
                changed = True
        return replace(policy, models=models) if changed else policy

    def _expand_model(self, model: Model) -> Model:
        replicas: dict[str, None] = {}  # ordered, without duplicates
        served_names: dict[str, str] = {}
        for entry in model.replicas:
            found = self.replicas(entry) if is_service_name(entry) else (entry,)
            for replica in found:
                replicas[replica] = None
                if model.served_names:
                    served_names[replica] = model.served_name_for(entry)
        return replace(model, replicas=tuple(replicas), served_names=served_names)


def service_names(policy: Policy) -> set[str]:
    """Every service name a policy's models list among their replicas."""
    return {
        replica
        for model in policy.models.values()
        for replica in model.replicas
        if is_service_name(replica)
    }
