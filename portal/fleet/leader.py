"""One publisher at a time: a second one (a standby, or two stacks on one Valkey) would
double every page's updates and the reads. The lease is one key with a TTL, renewed each tick
by its holder; a standby takes over once the holder stops renewing."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Final, cast

import valkey.asyncio as avalkey

LEADER_KEY: Final = "sy:portal:fleet:publisher"

# Only the holder's own lease is renewed or dropped: compare and act in one step.
_RENEW: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass
class Leadership:
    client: avalkey.Valkey
    ttl_ms: int = 3_000  # a few ticks: a holder that stops is replaced within seconds
    me: str = field(default_factory=lambda: uuid.uuid4().hex)

    async def _eval(self, script: str, *args: Any) -> int:
        reply = self.client.eval(script, 1, LEADER_KEY, *args)
        return int(await cast(Awaitable[Any], reply))

    async def hold(self) -> bool:
        """True while this process is the publisher (taking the lease when it is free)."""
        if await self.client.set(LEADER_KEY, self.me, nx=True, px=self.ttl_ms):
            return True
        return await self._eval(_RENEW, self.me, self.ttl_ms) == 1

    async def release(self) -> None:
        """Hand over at once on a clean stop, not after the TTL."""
        await self._eval(_RELEASE, self.me)
