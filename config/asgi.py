"""The web process: Django (portal, /api/, admin) over HTTP, Channels over websockets."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

# These need the apps loaded.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from config.health import HealthEndpoints  # noqa: E402
from portal.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # The probes' two paths first (config/health.py), ahead of Django's host check.
        "http": HealthEndpoints(django_asgi_app),
        # The session cookie signs the socket in, as it does the pages; the Origin check
        # keeps another site's page from opening it with the visitor's cookie.
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
