"""ASGI entry point: HTTP through Django, websockets through Channels.

Static files are served by the app itself unless QUICKSAVE_SERVE_STATIC is off
(set it off behind a reverse proxy or CDN that serves STATIC_ROOT).
"""

import os

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quicksave.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (Django must be set up first)
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.QUICKSAVE_SERVE_STATIC else django_asgi_app

application = ProtocolTypeRouter({"http": http_app})
