"""The Django project: settings, URLs, the web ASGI app, the Celery app.

It sits on top of everything it wires together (the apps, their URLs, the beat schedule); no
product package imports it. The runtime floor every process shares (env parsing, Valkey URLs,
service helpers) is ``runtime/``; the operator's tools (the embedded stack, container roles,
the demo seed) are ``ops/``. Loading the Celery app here, as Celery's Django guide does, binds
``@shared_task`` to the Valkey broker in every Django process, so that ``.delay()`` from the web
process reaches the right broker.
"""

from config.celery import app as celery_app

__all__ = ["celery_app"]
