"""ASGI entry point of the gateway process: ``uvicorn gateway.asgi:app``."""

import logging

from config.env import env_str
from gateway.app import create_app

logging.basicConfig(
    level=env_str("SWITCHYARD_LOG_LEVEL", "INFO"),
    format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
)

app = create_app()
