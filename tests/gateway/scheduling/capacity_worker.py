"""One gateway-like process for the multi-process capacity test.

    python -m tests.gateway.scheduling.capacity_worker VALKEY_URL GATEWAY_ID REQUESTS CAPS_JSON

Waits until every worker is ready (a counter in Valkey), then runs REQUESTS acquire/hold/
release cycles at once through its own Scheduler. While holding a grant it counts itself in
``test:using:<replica>``; a count above the replica's cap is a violation. Prints a JSON
summary on stdout.
"""

from __future__ import annotations

import asyncio
import random
import sys

import orjson
import valkey.asyncio as avalkey

from gateway.scheduling import Scheduler, Ticket


async def main(url: str, gateway_id: str, requests: int, caps: dict[str, int]) -> dict[str, int]:
    client = avalkey.Valkey.from_url(url)
    scheduler = Scheduler(client, gateway_id=gateway_id, stale_ms=120_000, poll_interval_s=0.05)
    await scheduler.start()
    rng = random.Random(gateway_id)
    summary = {"granted": 0, "violations": 0, "peak": 0}
    try:
        # Start together, so that the processes really contend (another process, not a task
        # of this one, moves the counter: there is nothing local to wait on).
        await client.incr("test:ready")
        workers = int(await client.get("test:workers"))
        for _ in range(2_000):  # at most 10 s
            if int(await client.get("test:ready") or 0) >= workers:
                break
            await asyncio.sleep(0.005)

        async def one(n: int) -> None:
            ticket = Ticket(
                request_id=f"{gateway_id}-{n}",
                model="llama",
                replicas=tuple(caps.items()),
                rank=n % 3,
                priority_class=f"class-{n % 3}",
                queue_timeout_s=30.0,
                max_queue_length=10_000,
                tenant=f"tenant-{n % 5}",
                use_case_id=n % 7,
                cost=rng.choice((200, 2_000, 28_000)),
            )
            async with scheduler.hold(ticket) as grant:
                using = int(await client.incr(f"test:using:{grant.replica}"))
                summary["peak"] = max(summary["peak"], using)
                if using > caps[grant.replica]:
                    summary["violations"] += 1
                summary["granted"] += 1
                await asyncio.sleep(rng.random() * 0.004)
                await client.decr(f"test:using:{grant.replica}")

        await asyncio.gather(*(one(n) for n in range(requests)))
    finally:
        await scheduler.close()
        await client.aclose()
    return summary


if __name__ == "__main__":
    url, gateway_id, requests, caps = sys.argv[1:5]
    result = asyncio.run(main(url, gateway_id, int(requests), orjson.loads(caps)))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
