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

# Taken when free, renewed when the holder's own, in one step: as two calls (SET NX, then a
# renewal) a lease running out between them was neither taken nor renewed, and its holder
# skipped a tick as if another held it.
_HOLD: Final = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
# Only the holder's own lease is dropped: compare and act in one step.
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
        return await self._eval(_HOLD, self.me, self.ttl_ms) == 1

    async def release(self) -> None:
        """Hand over at once on a clean stop, not after the TTL."""
        await self._eval(_RELEASE, self.me)
