"""ASGI entry point of the gateway process: ``uvicorn gateway.asgi:app``."""

from gateway import logcontext
from gateway.app import create_app
from runtime.env import env_str

logcontext.configure(env_str("SWITCHYARD_LOG_LEVEL", "INFO"))

app = create_app()
