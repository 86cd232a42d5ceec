"""ASGI entry point of the gateway process: ``uvicorn gateway.asgi:app``."""

from gateway.app import create_app

app = create_app()
