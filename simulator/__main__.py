"""``python -m simulator``: serve one simulated vLLM replica with uvicorn."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import uvicorn

from simulator.app import create_app
from simulator.config import parse_args
from simulator.faults import CUT_STREAM_LOG_FILTER


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    server_config = uvicorn.Config(
        create_app(config),
        host=config.host,
        port=config.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        proxy_headers=False,  # loopback clients only; skips a middleware on every request
        log_level="warning",
        lifespan="on",
    )
    # After uvicorn.Config has set up logging, so that its setup does not drop the filter.
    logging.getLogger("uvicorn.error").addFilter(CUT_STREAM_LOG_FILTER)
    uvicorn.Server(server_config).run()


if __name__ == "__main__":
    main(sys.argv[1:])
