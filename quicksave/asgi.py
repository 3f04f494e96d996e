"""ASGI entry point: HTTP through Django, websockets through Channels.

HTTP requests run Django's WSGI handler on a pool of request threads (quicksave/http_app.py):
one thread hop per request, where Django's own ASGI handler hops for every middleware and
signal; every view here is synchronous anyway.

With QUICKSAVE_EMBEDDED_WORKER (on by default with the embedded database) the agent
worker runs in a thread of this process, and so do the background services apps register
(the notifications dispatcher), so the one-command set-up resumes agents and sends notifications.

Static files are served by the app itself unless QUICKSAVE_SERVE_STATIC is off
(set it off behind a reverse proxy or CDN that serves STATIC_ROOT).
"""

import os
from typing import Any

from django.conf import settings
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quicksave.settings")
django_wsgi_app = get_wsgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (Django must be set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import StaticFilesHandler  # noqa: E402

from quicksave.http_app import http_application  # noqa: E402

# Static files take the same WSGI path as pages: Django's ASGI static handler would read a
# whole file into memory before sending it (a synchronous iterator under ASGI).
wsgi_app: Any = StaticFilesHandler(django_wsgi_app) if settings.QUICKSAVE_SERVE_STATIC else django_wsgi_app
http_app = http_application(wsgi_app)

from approvals.routing import websocket_urlpatterns as inbox_routes  # noqa: E402
from checkpoints.routing import fallback_routes  # noqa: E402
from checkpoints.routing import websocket_urlpatterns as thread_routes  # noqa: E402
from memory.routing import websocket_urlpatterns as memory_routes  # noqa: E402
from quicksave_agents.ws_auth import AgentKeyAuthMiddleware  # noqa: E402

routes = [*thread_routes, *inbox_routes, *memory_routes, *fallback_routes]
websocket_app = AllowedHostsOriginValidator(AuthMiddlewareStack(AgentKeyAuthMiddleware(URLRouter(routes))))

application = ProtocolTypeRouter({"http": http_app, "websocket": websocket_app})

if settings.QUICKSAVE_EMBEDDED_WORKER:
    import threading

    from quicksave import background
    from quicksave_agents.worker import start_background_worker

    start_background_worker()
    background.start_all(threading.Event())
