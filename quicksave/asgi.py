"""ASGI entry point: HTTP through Django, websockets through Channels.

HTTP requests run Django's WSGI handler in a worker thread, one thread hop per
request. Django's own ASGI handler hops threads for every middleware and signal
(over thirty hops a request), which cost more than our whole checkpoint write;
every view here is synchronous anyway.

With QUICKSAVE_EMBEDDED_WORKER (on by default with the embedded database) the agent
worker runs in a thread of this process, so the one-command set-up resumes agents.

Static files are served by the app itself unless QUICKSAVE_SERVE_STATIC is off
(set it off behind a reverse proxy or CDN that serves STATIC_ROOT).
"""

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.core.wsgi import get_wsgi_application

from quicksave.errors import payload_too_large

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "quicksave.settings")
django_wsgi_app = get_wsgi_application()

from asgiref.sync import sync_to_async  # noqa: E402  (Django must be set up first)
from asgiref.wsgi import WsgiToAsgi, WsgiToAsgiInstance  # noqa: E402
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import StaticFilesHandler  # noqa: E402

# asgiref would run every request on one shared thread (thread_sensitive); a pool lets
# requests that wait on the database overlap. Sized for runs/claim long-polls, which
# hold a thread each for up to 30 seconds.
_request_threads = ThreadPoolExecutor(max_workers=settings.QUICKSAVE_HTTP_THREADS, thread_name_prefix="http")


class _TooLarge(Exception):
    """The request body grew past QUICKSAVE_MAX_REQUEST_BYTES while it was being read."""


async def _refuse_too_large(send: Any) -> None:
    """Answer 413 in the API's error format without reading (the rest of) the body."""
    body = json.dumps({"error": payload_too_large(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)}).encode()
    await send({
        "type": "http.response.start", "status": 413,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close")],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


class _PooledInstance(WsgiToAsgiInstance):
    """asgiref's WSGI adapter with three changes: the app runs on our pool of request threads,
    its response is closed as WSGI requires, and a response that is not streamed goes back to
    the event loop in one piece once the app has returned. (asgiref hands every part to the
    loop with a blocking hop from the request thread, three per request, together costing
    about as much as a checkpoint write.)"""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.async_send = send
        # asgiref reads the whole body (to a temporary file past 64 KiB) before the app sees the
        # request, so the parser's limit would only apply once a huge upload had been written out.
        limit: int = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await _refuse_too_large(send)
            return
        received = 0

        async def capped_receive() -> Any:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:  # a chunked body, which declares no length
                raise _TooLarge
            return message

        try:
            await super().__call__(scope, capped_receive, send)  # type: ignore[no-untyped-call]
        except _TooLarge:
            await _refuse_too_large(send)

    async def run_wsgi_app(self, body: Any) -> None:
        for message in await self.respond(body):
            await self.async_send(message)

    def _respond(self, body: Any) -> list[dict[str, Any]]:
        """Run the app: the messages that send its response, or none when it streamed them itself."""
        try:
            environ = self.build_environ(self.scope, body)  # type: ignore[no-untyped-call]
        except ValueError:
            return [
                {"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"text/plain")]},
                {"type": "http.response.body", "body": b"Bad Request: Too many duplicate headers"},
            ]
        response = self.wsgi_application(environ, self.start_response)
        try:
            if getattr(response, "streaming", False):  # exports and static files go part by part
                self._stream(response)
                return []
            content = b"".join(response)
        finally:
            # What every WSGI server does and asgiref does not: closing the response ends
            # Django's request (request_finished), which gives the thread's database connection
            # back to the pool. Without it an idle request thread keeps its connection, and
            # more threads than pooled connections time out waiting for one.
            response.close()
        if self.response_content_length is not None:
            content = content[: self.response_content_length]
        return [self.response_start, {"type": "http.response.body", "body": content}]

    respond = sync_to_async(_respond, thread_sensitive=False, executor=_request_threads)

    def _stream(self, response: Any) -> None:
        """asgiref's own loop: each part as the app yields it, capped at the declared length."""
        sent = 0
        for output in response:
            if not self.response_started:
                self.response_started = True
                self.sync_send(self.response_start)
            if self.response_content_length is not None:
                output = output[: self.response_content_length - sent]
            self.sync_send({"type": "http.response.body", "body": output, "more_body": True})
            sent += len(output)
            if sent == self.response_content_length:
                break
        if not self.response_started:
            self.response_started = True
            self.sync_send(self.response_start)
        self.sync_send({"type": "http.response.body"})


class PooledWsgiToAsgi(WsgiToAsgi):
    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await _PooledInstance(self.wsgi_application)(scope, receive, send)  # type: ignore[no-untyped-call]


# Static files take the same pooled WSGI path as pages (Django's ASGI static handler
# trips over asgiref's thread-sensitive executor under load).
wsgi_app: Any = StaticFilesHandler(django_wsgi_app) if settings.QUICKSAVE_SERVE_STATIC else django_wsgi_app
http_app: Any = PooledWsgiToAsgi(wsgi_app)  # type: ignore[no-untyped-call]

from agents.ws_auth import AgentKeyAuthMiddleware  # noqa: E402
from approvals.routing import websocket_urlpatterns as inbox_routes  # noqa: E402
from checkpoints.routing import fallback_routes  # noqa: E402
from checkpoints.routing import websocket_urlpatterns as thread_routes  # noqa: E402

websocket_app = AllowedHostsOriginValidator(
    AuthMiddlewareStack(AgentKeyAuthMiddleware(URLRouter([*thread_routes, *inbox_routes, *fallback_routes])))
)

application = ProtocolTypeRouter({"http": http_app, "websocket": websocket_app})

if settings.QUICKSAVE_EMBEDDED_WORKER:
    from agents.worker import start_background_worker

    start_background_worker()
