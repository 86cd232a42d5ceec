"""``python -m scheduler.batcher``: run one batcher until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

from runtime.service import run_service
from scheduler.batcher.settings import BatcherSettings
from scheduler.batcher.worker import Batcher

logger = logging.getLogger("scheduler.batcher")


async def serve(settings: BatcherSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    batcher = Batcher(settings)
    batcher.metrics.serve(settings.metrics_port, settings.metrics_host)
    await batcher.start()
    # What is loaded by now lives as long as the process: out of the collector's full passes,
    # which otherwise walk it all and stall every buffer's timer (as the gateway does).
    gc.collect()
    gc.freeze()
    try:
        await stop.wait()
    finally:
        await batcher.stop()


def main() -> int:
    return run_service("batcher", BatcherSettings.from_env, serve)


if __name__ == "__main__":
    sys.exit(main())
