"""Project configuration: settings, URLs, ASGI entry points, the Celery app, the embedded stack.

Kept import-light on purpose: the gateway and the simulator import ``config.env`` without
pulling in Django or Celery. The Celery app is loaded by ``scheduler.apps`` when Django starts.
"""
