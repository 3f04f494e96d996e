"""HTTP on ASGI: Django's WSGI handler behind asgiref's public `WsgiToAsgi`, with three
guards written against the ASGI spec and PEP 3333 only.

- `cap_request_body`: a body past QUICKSAVE_MAX_REQUEST_BYTES gets the API's 413 before it is
  read. `WsgiToAsgi` (like Django's ASGI handler) reads the whole body, to a temporary file,
  before the app sees the request, so the parser's own limit would come too late.
- `request_threads`: each request gets a thread of its own (asgiref's `ThreadSensitiveContext`;
  without it every request would queue on one shared thread), at most QUICKSAVE_HTTP_THREADS
  at a time, so requests that wait on the database or a runs/claim long-poll overlap.
- `closing`: the WSGI response is closed, as every WSGI server does and `WsgiToAsgi` does not.
  Closing ends Django's request (`request_finished`), which gives the thread's database
  connection back to the pool.

Why not Django's own ASGI handler: it buffers a streamed response with a synchronous iterator
(the JSON-lines export, static files) whole in memory before sending a byte of it, and every
view here is synchronous.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from typing import Any

from asgiref.sync import ThreadSensitiveContext
from asgiref.wsgi import WsgiToAsgi
from django.conf import settings

from quicksave.errors import payload_too_large

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def closing(app: WSGIApp) -> WSGIApp:
    """`app` whose response is closed once it has been sent, or abandoned (PEP 3333)."""

    def respond(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        response = app(environ, start_response)
        try:
            yield from response
        finally:
            close = getattr(response, "close", None)
            if close is not None:
                close()

    return respond


class BodyTooLarge(Exception):
    """The request body grew past the limit while it was being read."""


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
    """Refuse a body declared past DATA_UPLOAD_MAX_MEMORY_SIZE unread, and a chunked one (which
    declares no length) at the first message that crosses it."""

    async def capped(scope: Scope, receive: Receive, send: Send) -> None:
        limit: int = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await refuse_too_large(send, limit)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise BodyTooLarge
            return message

        try:
            await app(scope, receive_within_limit, send)
        except BodyTooLarge:  # raised while the body is read, before the app could answer
            await refuse_too_large(send, limit)

    return capped


def request_threads(app: ASGIApp, *, limit: int) -> ASGIApp:
    """Run each request's synchronous work on a thread of its own, `limit` requests at a time."""
    slots = asyncio.Semaphore(limit)

    async def threaded(scope: Scope, receive: Receive, send: Send) -> None:
        request_context = contextvars.copy_context()

        async def send_in_request_context(message: Message) -> None:
            # `WsgiToAsgi` sends from the request thread through `async_to_sync`, whose context
            # names that thread's executor. The server may start the connection's next request
            # inside `send`, and that request's task would inherit the context and hand its work
            # to an executor that is gone ("CurrentThreadExecutor already quit", asgiref #491).
            await asyncio.create_task(send(message), context=request_context.copy())

        async with slots, ThreadSensitiveContext():
            await app(scope, receive, send_in_request_context)

    return threaded


def http_application(wsgi_app: WSGIApp) -> ASGIApp:
    """The ASGI app for HTTP requests to `wsgi_app`."""
    adapter: ASGIApp = WsgiToAsgi(closing(wsgi_app))  # type: ignore[no-untyped-call]
    return cap_request_body(request_threads(adapter, limit=settings.QUICKSAVE_HTTP_THREADS))
