"""peek.lua (``Scheduler.check_limits``): the rate limits judged as acquire judges them,
nothing counted — what a request with request guardrails asks before its checks run."""

from __future__ import annotations

import pytest

from gateway.admission import MINUTE_MS, Limit
from gateway.scheduling import RateLimited, Ticket

from .conftest import MODEL, R1, running_schedulers, write_fresh_fleet


def _ticket(request_id: str, limit: int) -> Ticket:
    return Ticket(
        request_id=request_id,
        model=MODEL,
        replicas=((R1, 1_000),),
        rank=0,
        priority_class="prod",
        queue_timeout_s=5.0,
        max_queue_length=100,
        tenant="acme",
        use_case_id=12,
        limits=(Limit("uc:12:rpm", "req", MINUTE_MS, limit, 1, "the use case's limit"),),
    )


async def test_peeking_counts_nothing_and_refuses_what_acquire_would(valkey_url, valkey_client):
    """GIVEN a limit of 2 requests a minute WHEN the limits are peeked at ten times
    THEN two acquires still pass; after them a peek refuses as acquire would."""
    async with running_schedulers(valkey_url) as [scheduler]:
        await write_fresh_fleet(scheduler._client, [R1])
        for i in range(10):
            await scheduler.check_limits(_ticket(f"peek-{i}", 2))
        for i in range(2):
            grant = await scheduler.acquire(_ticket(f"req-{i}", 2))
            await scheduler.release(grant)
        with pytest.raises(RateLimited) as refused:
            await scheduler.check_limits(_ticket("peek-late", 2))
        assert refused.value.limit.name == "the use case's limit"
        assert refused.value.retry_after_s > 0
        with pytest.raises(RateLimited):
            await scheduler.acquire(_ticket("req-late", 2))
