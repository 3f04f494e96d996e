from django.urls import re_path

from memory.consumers import BoardConsumer, PageConsumer

websocket_urlpatterns = [
    re_path(r"^ws/memory/boards/(?P<namespace>[^/]+)/$", BoardConsumer.as_asgi()),
    re_path(r"^ws/memory/$", PageConsumer.as_asgi()),
]
