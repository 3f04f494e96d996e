"""HTTP on ASGI: Django's WSGI handler on a pool of request threads, behind a cap on the request
body, written against the ASGI spec and PEP 3333 only.

`WSGIThreads` runs the app on a pool of QUICKSAVE_HTTP_THREADS threads, so requests that wait on
the database or a runs/claim long-poll overlap, and closes each response as PEP 3333 requires:
closing ends Django's request (`request_finished`), which gives the thread's database connection
back to the pool. A request costs one hop to a request thread and one back: the body has been
read before the app runs (`cap_request_body`), and a response that is not streamed goes back to
the event loop whole once the app has returned. Only a streamed one (the JSON-lines export,
static files) hands each part to the loop as it comes. a2wsgi's `WSGIMiddleware`, used before,
hopped from the request thread to the loop and waited there for every read of the body and every
part of the response, four times for a checkpoint write: on bench/checkpoint_store.py's HTTP
workload that was a fifth of the request's time on a busy machine. asgiref's public `WsgiToAsgi`
with a thread per request took twice as long per checkpoint, and Django's own ASGI handler reads
a streamed response with a synchronous iterator whole into memory before sending it.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings

from quicksave.errors import payload_too_large

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Coroutine[Any, Any, None]]
ASGIApp = Callable[[Scope, Receive, Send], Coroutine[Any, Any, None]]
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


async def refuse_too_large(send: Send, limit: int) -> None:
    """Answer 413 in the API's error format, and close the connection on the unread body."""
    body = json.dumps({"error": payload_too_large(limit)}).encode()
    await send({
        "type": "http.response.start", "status": 413,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close")],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def cap_request_body(app: ASGIApp) -> ASGIApp:
    """Read the body before `app` runs, at most DATA_UPLOAD_MAX_MEMORY_SIZE of it: one declared
    past that is refused unread, a chunked one (which declares no length) at the first message
    that crosses it, instead of the parser finding out once the request thread has it all."""

    async def capped(scope: Scope, receive: Receive, send: Send) -> None:
        limit: int = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await refuse_too_large(send, limit)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            if len(body) > limit:
                await refuse_too_large(send, limit)
                return
            if not message.get("more_body", False):
                break
        pending: Message | None = {"type": "http.request", "body": bytes(body), "more_body": False}

        async def receive_read_body() -> Message:
            nonlocal pending
            if pending is None:
                return await receive()  # after the body: the disconnect, when it comes
            message, pending = pending, None
            return message

        await app(scope, receive_read_body, send)

    return capped


def wsgi_environ(scope: Scope, body: bytes) -> dict[str, Any]:
    """The WSGI environ (PEP 3333) of an ASGI HTTP request whose whole body is `body`."""
    script_name = scope.get("root_path", "").encode().decode("latin1")
    path_info = scope["path"].encode().decode("latin1")
    if script_name and path_info.startswith(script_name):
        path_info = path_info[len(script_name) :]
    server_name, server_port = scope.get("server") or ("localhost", 80)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": script_name,
        "PATH_INFO": path_info,
        "QUERY_STRING": scope.get("query_string", b"").decode("latin1"),
        "SERVER_NAME": server_name,
        "SERVER_PORT": str(server_port or 0),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if (client := scope.get("client")) is not None:
        environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = client[0], str(client[1])
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin1").upper().replace("-", "_")
        key = name if name in ("CONTENT_LENGTH", "CONTENT_TYPE") else f"HTTP_{name}"
        value = raw_value.decode("latin1")
        # A header sent twice is one comma-separated value (RFC 9110 5.3).
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


class WSGIThreads:
    """An ASGI app that runs a WSGI app on a pool of request threads, one request at a time each.

    Wrapped in `cap_request_body`, which has read the whole body into one message before this runs.
    """

    def __init__(self, app: WSGIApp, *, threads: int) -> None:
        self.app = app
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="http")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        body: bytes = message.get("body", b"") if message["type"] == "http.request" else b""
        loop = asyncio.get_running_loop()
        # The request thread sees the context vars of the request's task, as a task would.
        context = contextvars.copy_context()
        answer = await loop.run_in_executor(self.executor, context.run, self._respond, wsgi_environ(scope, body),
                                            send, loop)  # fmt: skip
        for reply in answer:
            await send(reply)

    def _respond(self, environ: dict[str, Any], send: Send, loop: asyncio.AbstractEventLoop) -> list[Message]:
        """Run the app in this request thread: the messages of its response for the loop to send, or
        none when it was streamed from here part by part."""
        response = _Response()
        parts = self.app(environ, response.start)
        try:
            if not getattr(parts, "streaming", False):
                return [response.head(), {"type": "http.response.body", "body": b"".join(parts)}]

            def send_now(message: Message) -> None:
                asyncio.run_coroutine_threadsafe(send(message), loop).result()

            for part in parts:
                if not response.sent:
                    send_now(response.head())
                send_now({"type": "http.response.body", "body": part, "more_body": True})
            if not response.sent:
                send_now(response.head())
            send_now({"type": "http.response.body"})
            return []
        finally:
            # PEP 3333: closing the response ends Django's request, which gives the connection back.
            close = getattr(parts, "close", None)
            if close is not None:
                close()


class _Response:
    """What the app's `start_response` was told: the status and headers of the response."""

    def __init__(self) -> None:
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.sent = False

    def start(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        if exc_info is not None and self.sent:
            raise exc_info[1].with_traceback(exc_info[2])
        self.status = int(status.split(" ", 1)[0])
        self.headers = [(name.strip().lower().encode("latin1"), value.strip().encode("latin1"))
                        for name, value in headers]  # fmt: skip
        return _no_write

    def head(self) -> Message:
        self.sent = True
        return {"type": "http.response.start", "status": self.status, "headers": self.headers}


def _no_write(data: bytes) -> None:
    """PEP 3333's `write` callable, which Django never calls: the response is what the app returns."""
    raise NotImplementedError("write() is not supported: return the response body from the app")


def http_application(wsgi_app: WSGIApp) -> ASGIApp:
    """The ASGI app for HTTP requests to `wsgi_app`."""
    return cap_request_body(WSGIThreads(wsgi_app, threads=settings.QUICKSAVE_HTTP_THREADS))
