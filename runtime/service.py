"""How a long-running asyncio process of ours starts: logging in the project's format, its
settings from the environment (a bad one is a clear message and exit status 2, not a
traceback), then its ``serve`` coroutine on uvloop when it is installed."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from runtime.env import ConfigurationError, env_str

SettingsT = TypeVar("SettingsT")


def run_service(
    name: str,
    load_settings: Callable[[], SettingsT],
    serve: Callable[[SettingsT], Coroutine[Any, Any, None]],
) -> int:
    """Run ``serve(load_settings())`` until it returns; the process's exit status."""
    logging.basicConfig(
        level=env_str("SWITCHYARD_LOG_LEVEL", "INFO"),
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    try:
        settings = load_settings()
    except ConfigurationError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(settings))
    return 0
