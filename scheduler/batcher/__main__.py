"""``python -m scheduler.batcher``: run one batcher until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Callable

from config.env import ConfigurationError, env_str
from scheduler.batcher.settings import BatcherSettings
from scheduler.batcher.worker import Batcher

logger = logging.getLogger("scheduler.batcher")


async def serve(settings: BatcherSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    batcher = Batcher(settings)
    batcher.metrics.serve(settings.metrics_port)
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
    logging.basicConfig(
        level=env_str("SWITCHYARD_LOG_LEVEL", "INFO"),
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    try:
        settings = BatcherSettings.from_env()
    except ConfigurationError as exc:
        print(f"batcher: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
