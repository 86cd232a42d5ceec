"""Keeps the current policy in memory, refreshed from Valkey in the background.

Requests read ``store.current()`` — a field access, no I/O. If Valkey is unreachable the
last policy keeps serving for ``policy_max_staleness_s``; after that the gateway fails closed
(503), because a revocation it cannot see must not stay ineffective for ever.

Replicas given as a headless Service's name (``dns+http://…``) are resolved here, on each
refresh that finds one due (gateway/discovery.py): ``current()`` serves the policy with
those names replaced by the replicas found, rebuilt only when the snapshot or an answer
changed.
"""

from __future__ import annotations

import asyncio
import logging
import time

import valkey.asyncio as avalkey

from gateway.discovery import DiscoverySettings, ReplicaDiscovery, service_names
from gateway.errors import service_unavailable
from gateway.policy import SNAPSHOT_KEY, VERSION_KEY, Policy, parse_snapshot
from runtime.valkey_urls import VALKEY_FAILURES

logger = logging.getLogger(__name__)


class PolicyStore:
    def __init__(
        self,
        client: avalkey.Valkey,
        *,
        refresh_s: float,
        max_staleness_s: float,
        discovery: ReplicaDiscovery | None = None,
    ) -> None:
        self._client = client
        self._refresh_s = refresh_s
        self._max_staleness_s = max_staleness_s
        self._discovery = discovery or ReplicaDiscovery(DiscoverySettings.from_env())
        self._published: Policy | None = None  # as governance wrote it
        self._policy: Policy | None = None  # what requests see: service names resolved
        self._synced_at = 0.0  # monotonic time of the last successful read of Valkey
        self._stopping = False

    @property
    def version(self) -> int | None:
        return self._policy.version if self._policy else None

    def current(self) -> Policy:
        policy = self._policy
        if policy is None:
            raise service_unavailable(
                "The gateway has not loaded its policy yet; retry shortly.",
                code="policy_not_loaded",
            )
        if time.monotonic() - self._synced_at > self._max_staleness_s:
            raise service_unavailable(
                "The gateway cannot confirm its policy is current; retry shortly.",
                code="policy_stale",
            )
        return policy

    async def refresh(self) -> bool:
        """Read the version; fetch and parse the snapshot if it moved. Returns whether it did."""
        version = await self._client.get(VERSION_KEY)
        changed = False
        published = self._published
        if version is not None and (published is None or int(version) != published.version):
            raw = await self._client.get(SNAPSHOT_KEY)
            if raw is not None:
                self._published = parse_snapshot(raw)
                changed = True
                logger.info(
                    "policy_loaded version=%s models=%s keys=%s",
                    self._published.version,
                    len(self._published.models),
                    len(self._published.principals),
                )
        if self._published is not None:
            # Only names never resolved or due are looked up; none at all without any.
            rediscovered = await self._discovery.refresh(service_names(self._published))
            if changed or rediscovered:
                self._policy = self._discovery.expand(self._published)
        self._synced_at = time.monotonic()
        return changed

    def stop(self) -> None:
        """Ask run() to end. A flag as well as task cancellation, because valkey-py can swallow
        a CancelledError that lands inside a command (seen in about 1% of cancels)."""
        self._stopping = True

    async def run(self) -> None:
        """Refresh until stopped; survives Valkey outages and malformed snapshots."""
        while not self._stopping:
            try:
                await self.refresh()
            except VALKEY_FAILURES as exc:
                logger.warning("policy_refresh_failed error=%s", exc.__class__.__name__)
            except (ValueError, KeyError, TypeError) as exc:
                logger.error("policy_snapshot_invalid error=%r", exc)
            await asyncio.sleep(self._refresh_s)
