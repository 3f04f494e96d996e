"""HTTP on ASGI: Django's WSGI handler on a pool of request threads (a2wsgi's `WSGIMiddleware`),
behind a cap on the request body written against the ASGI spec.

a2wsgi runs the app on a pool of QUICKSAVE_HTTP_THREADS threads, so requests that wait on the
database or a runs/claim long-poll overlap, and closes each response as PEP 3333 requires:
closing ends Django's request (`request_finished`), which gives the thread's database
connection back to the pool. Measured on bench/checkpoint_store.py's HTTP workload it costs
what asgiref's private adapter did; asgiref's public `WsgiToAsgi` with a thread per request
took twice as long per checkpoint, and Django's own ASGI handler reads a streamed response with
a synchronous iterator (the JSON-lines export, static files) whole into memory before sending it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from a2wsgi import WSGIMiddleware
from django.conf import settings

from quicksave.errors import payload_too_large

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
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


def http_application(wsgi_app: WSGIApp) -> ASGIApp:
    """The ASGI app for HTTP requests to `wsgi_app`."""
    return cap_request_body(WSGIMiddleware(wsgi_app, workers=settings.QUICKSAVE_HTTP_THREADS))  # type: ignore[arg-type]
