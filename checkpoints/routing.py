from django.urls import path, re_path

from checkpoints.consumers import ThreadConsumer, ThreadListConsumer
from checkpoints.sockets import NoRoute

websocket_urlpatterns = [
    path("ws/threads/", ThreadListConsumer.as_asgi()),
    path("ws/threads/<uuid:thread_id>/", ThreadConsumer.as_asgi()),
]
# Last in the router: every other websocket path.
fallback_routes = [re_path(r"", NoRoute.as_asgi())]
