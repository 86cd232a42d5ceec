"""Rate limits in Valkey: one atomic Lua call per request checks every window and commits all
of them or none (admit.lua); reconcile.lua corrects the token windows afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import valkey.asyncio as avalkey

from gateway.admission.limits import Limit
from gateway.scheduling.keys import KEY_PREFIX

_HERE = Path(__file__).resolve().parent
ADMIT_LUA = (_HERE / "admit.lua").read_text()
RECONCILE_LUA = (_HERE / "reconcile.lua").read_text()


@dataclass(frozen=True, slots=True)
class Admission:
    """The outcome of ``RateLimiter.admit``; keep it until the request ends, for reconcile."""

    ok: bool
    limits: tuple[Limit, ...]
    now_ms: int
    refused: Limit | None = None
    # When refused: ms until the refusing limit has room again (if no one else arrives), or
    # -1 when the request is larger than the limit itself and can never pass.
    retry_after_ms: int = 0

    @property
    def never_fits(self) -> bool:
        return not self.ok and self.retry_after_ms < 0

    @property
    def retry_after_s(self) -> int:
        """For the ``Retry-After`` header: whole seconds, rounded up, at least 1."""
        return max(1, math.ceil(self.retry_after_ms / 1000))

    @property
    def estimated_tokens(self) -> int:
        return max((limit.cost for limit in self.limits if limit.kind == "tok"), default=0)


class RateLimiter:
    """Sliding-window rate limits shared by every gateway process through Valkey."""

    def __init__(self, client: avalkey.Valkey, *, prefix: str = KEY_PREFIX) -> None:
        self._prefix = prefix
        self._admit = client.register_script(ADMIT_LUA)
        self._reconcile = client.register_script(RECONCILE_LUA)

    async def admit(self, limits: Sequence[Limit], *, now_ms: int) -> Admission:
        """Count the request against every limit, or against none if any would overflow."""
        applicable = tuple(limits)
        if not applicable:
            return Admission(ok=True, limits=applicable, now_ms=now_ms)
        args: list[str | int] = [now_ms]
        for limit in applicable:
            args += [limit.id, limit.kind, limit.window_ms, limit.limit, limit.cost]
        reply = await self._admit(keys=[self._prefix], args=args)
        if int(reply[0]) == 1:
            return Admission(ok=True, limits=applicable, now_ms=now_ms)
        return Admission(
            ok=False,
            limits=applicable,
            now_ms=now_ms,
            refused=applicable[int(reply[1]) - 1],
            retry_after_ms=int(reply[2]),
        )

    async def reconcile(self, admission: Admission, *, actual_tokens: int, now_ms: int) -> int:
        """Add ``actual - estimated`` tokens to the windows the request was counted in.

        Returns how many windows were adjusted (0 when the estimate was exact, the request
        was refused, or the windows have expired).
        """
        if not admission.ok:
            return 0
        args: list[str | int] = [now_ms]
        for limit in admission.limits:
            delta = actual_tokens - limit.cost
            if limit.kind == "tok" and delta:
                args += [limit.id, limit.window_ms, admission.now_ms // limit.window_ms, delta]
        if len(args) == 1:
            return 0
        return int(await self._reconcile(keys=[self._prefix], args=args))
