"""Live updates: events go out to websocket groups after their transaction commits.

The Event table is the source of truth; the channel layer only makes delivery fast.
A process hands each committed event to one publisher thread (a queue, so the
writer never waits on Redis), which sends them in order to the thread's group and,
for approvals, to the inbox group: one `live.event` message, or one `live.events`
message carrying the events that queued up while the previous send was under way.
An event lost on the way (a process killed, Redis down) is not lost to clients: they
notice the gap in `seq` and replay from the table.

A socket lasts as long as the sign-in it was opened with: revoking its agent key or signing
its browser session out closes it with 4401 on every server process (a `sign_in.ended`
message to the key's or session's group, and, in case that message is lost, a re-check of
every open socket's sign-in once a second). While the channel layer cannot be reached,
sockets are refused (or closed) with 4503, and the outage is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any
from uuid import UUID

import redis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone
from opentelemetry.trace import SpanKind

from quicksave import metrics, telemetry
from quicksave_agents.models import AgentKey

log = logging.getLogger(__name__)

INBOX_GROUP = "inbox"
# The thread list's group: after each publisher round, the ids of the threads that had events.
THREADS_GROUP = "threads"
_THREAD_GROUP_PREFIX = "thread."
INBOX_TYPES = frozenset({"approval.requested", "approval.voted", "approval.escalated", "approval.decided"})
CHECKPOINT_CREATED = "checkpoint.created"
# At most this many queued events go out in one publisher round.
BATCH = 200
# A round waits this long after its first event for more to join it: a writer appending
# hundreds of checkpoints a second then costs the publisher (and the GIL it shares with the
# writer) one round per few events, for a delay no one watching a page can see.
LINGER_SECONDS = 0.005


# Close codes besides the refusals (4400, 4403, 4404): the socket's sign-in is over (or there was
# none), and the channel layer cannot be reached (a client retries later).
SIGNED_OUT = 4401
LIVE_UNAVAILABLE = 4503
# How often a process checks that the sign-ins of its open sockets still hold. The `sign_in.ended`
# message closes them sooner, but the channel layer may lose it (Redis down at that moment).
RECHECK_SECONDS = 1.0
# A group join slower than this counts as the channel layer being down (an unreachable Redis host
# would otherwise hold the handshake until the operating system gives up on the connection).
LAYER_TIMEOUT_SECONDS = 5.0
# A payload key that marks a queued item as a channel message to send as it is, not an event.
_AS_IS = "__message__"
# What the ASGI server raises on a send to a client that has left (uvicorn: ClientDisconnected, an
# OSError, or a RuntimeError for a close after the disconnect).
_CLIENT_GONE = (OSError, RuntimeError)


def thread_group(thread_id: UUID | str) -> str:
    return f"{_THREAD_GROUP_PREFIX}{thread_id}"


def agent_key_group(key_id: int) -> str:
    """The group of the sockets opened with one agent key."""
    return f"agentkey.{key_id}"


def session_group(session_key: str) -> str:
    """The group of the sockets opened by one browser session."""
    # Redis sees a digest: the session key itself would let anyone who can read Redis sign in.
    return f"session.{hashlib.sha256(session_key.encode()).hexdigest()[:32]}"


def message(*, thread_id: UUID | str, seq: int, type: str, data: dict[str, Any]) -> dict[str, Any]:
    """An event as websocket clients receive it (PRODUCT.md's shape)."""
    return {"type": type, "seq": seq, "thread": str(thread_id), "data": data}


# The largest frame a client may send (a ping is a few dozen bytes).
MAX_CLIENT_FRAME = 4096


@dataclass(frozen=True)
class SignIn:
    """What a socket was opened with and needs to stay open: an agent key, or a browser session
    and the person it signed in."""

    agent_key_id: int | None = None
    session_key: str | None = None
    user_id: int | None = None

    @property
    def group(self) -> str:
        if self.agent_key_id is not None:
            return agent_key_group(self.agent_key_id)
        assert self.session_key is not None
        return session_group(self.session_key)


def sign_in_of(scope: dict[str, Any]) -> SignIn | None:
    """The sign-in behind a socket's principal; None for a person without a session (only tests
    make those)."""
    user = scope.get("user")
    # A quicksave_agents.auth.AgentPrincipal, known by its key: quicksave_agents.auth imports
    # quicksave_agents.keys, which imports this module.
    key = getattr(user, "key", None)
    if isinstance(key, AgentKey):
        return SignIn(agent_key_id=key.pk)
    session_key = getattr(scope.get("session"), "session_key", None)
    if session_key and isinstance(getattr(user, "pk", None), int):
        return SignIn(session_key=session_key, user_id=user.pk)  # type: ignore[union-attr]
    return None


def ended_sign_ins(sign_ins: Collection[SignIn]) -> set[SignIn]:
    """Those of `sign_ins` that no longer hold: the key was revoked, the session signed out or
    expired, the person deactivated. At most three queries, however many sockets are open."""
    key_ids = {s.agent_key_id for s in sign_ins if s.agent_key_id is not None}
    user_ids = {s.user_id for s in sign_ins if s.user_id is not None}
    active_keys = set(AgentKey.objects.filter(pk__in=key_ids, revoked_at__isnull=True).values_list("pk", flat=True))
    active_users = set(User.objects.filter(pk__in=user_ids, is_active=True).values_list("pk", flat=True))
    live_sessions = _live_sessions({s.session_key for s in sign_ins if s.session_key is not None})
    return {
        s
        for s in sign_ins
        if (s.agent_key_id is not None and s.agent_key_id not in active_keys)
        or (s.session_key is not None and (s.session_key not in live_sessions or s.user_id not in active_users))
    }


def _live_sessions(session_keys: set[str]) -> set[str]:
    if not session_keys:
        return set()
    store = import_module(settings.SESSION_ENGINE).SessionStore
    if not hasattr(store, "get_model_class"):
        # Sessions kept outside the database (a cache, signed cookies) cannot be listed: their
        # sockets close on the sign-out message only.
        return session_keys
    return set(
        store.get_model_class()
        .objects.filter(session_key__in=session_keys, expire_date__gt=timezone.now())
        .values_list("session_key", flat=True)
    )


class _Outage:
    """Logs that something went away once, and once that it is back, instead of once per socket."""

    def __init__(self, what: str, consequence: str) -> None:
        self.what, self.consequence = what, consequence
        self.down = False
        self._lock = threading.Lock()  # the publisher thread reports too

    def began(self, error: BaseException) -> None:
        with self._lock:
            first, self.down = not self.down, True
        if first:
            log.error("%s failed (%s: %s): %s", self.what, type(error).__name__, error, self.consequence)

    def ended(self) -> None:
        with self._lock:
            was_down, self.down = self.down, False
        if was_down:
            log.warning("%s works again", self.what)


_layer_outage = _Outage(
    "The channel layer (Redis)",
    f"websockets are refused with {LIVE_UNAVAILABLE} and live events wait in the Event table until it is back",
)
_recheck_outage = _Outage(
    "Checking the sign-ins of open websockets", "they stay open until a check succeeds or a sign-out message arrives"
)


class _SignInWatch:
    """The open sockets of one event loop, by the sign-in each needs, all checked again every
    RECHECK_SECONDS in one database round (a query per socket per second would not scale)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.sockets: dict[EventConsumer, SignIn] = {}
        self.task: asyncio.Task[None] | None = None

    def add(self, consumer: EventConsumer, sign_in: SignIn) -> None:
        self.sockets[consumer] = sign_in
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self._run())

    def discard(self, consumer: EventConsumer) -> None:
        self.sockets.pop(consumer, None)

    async def _run(self) -> None:
        while self.sockets:  # ends with the last socket; the next one starts it again
            await asyncio.sleep(RECHECK_SECONDS)
            watched = dict(self.sockets)
            try:
                ended = await database_sync_to_async(ended_sign_ins)(set(watched.values()))
            except Exception as error:  # the database is down: keep watching, and say so once
                _recheck_outage.began(error)
                continue
            _recheck_outage.ended()
            for consumer, sign_in in watched.items():
                if sign_in in ended:
                    await consumer.sign_in_ended()


_watch: _SignInWatch | None = None


def _current_watch() -> _SignInWatch:
    """The watch of the running loop (a server has one; tests run a loop per test)."""
    global _watch
    loop = asyncio.get_running_loop()
    if _watch is None or _watch.loop is not loop:
        _watch = _SignInWatch(loop)
    return _watch


class EventConsumer(AsyncJsonWebsocketConsumer):
    """A websocket that receives the publisher's messages: `live.event` goes to `live_event`,
    which a consumer defines; `live.events` (a batch) hands it each event in order.

    It stays open while its sign-in holds (SignIn): `sign_in.ended`, sent to the sign-in's group,
    or the process's re-check closes it with 4401.
    """

    # What the socket follows, for the connections gauge: thread, threads or inbox.
    feed = "events"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.joined: list[str] = []
        self._counted = False
        self.accepted = False
        self.closed = False
        # The re-check closes a socket from another task: a send must not interleave with it.
        self._sending = asyncio.Lock()
        self._watch: _SignInWatch | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Serve the socket; if the channel layer fails under it (Redis went away), close it with
        4503 and log the outage once instead of a traceback per socket."""
        try:
            await super().__call__(scope, receive, send)
        except redis.RedisError as error:
            _layer_outage.began(error)
            with contextlib.suppress(*_CLIENT_GONE):
                if not self.accepted:
                    await self.accept()
                await self.close(code=LIVE_UNAVAILABLE)
        finally:
            self._unwatch()  # however it ended (a cancelled consumer gets no disconnect)
            if self._counted:
                self._counted = False
                metrics.websocket_connections.labels(feed=self.feed).dec()

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Handle a channel message; one the publisher sent for traced writes is handled in a span
        continuing the trace of the publisher's send."""
        trace = message.get("trace")
        if not trace:
            await super().dispatch(message)
            return
        with telemetry.span("quicksave.websocket.push", carrier=trace, kind=SpanKind.CONSUMER,
                            attributes={"quicksave.feed": self.feed}):  # fmt: skip
            await super().dispatch(message)

    async def signed_in(self) -> Any | None:
        """The principal connecting (a person or an agent key), after noting the server's loop;
        None, with the socket refused with 4401, when nobody is signed in."""
        register_server_loop(asyncio.get_running_loop())
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(SIGNED_OUT)
            return None
        return user

    async def join(self, *groups: str) -> bool:
        """Join `groups` and the group of this socket's sign-in, then watch the sign-in; False, with
        the socket refused with 4503, when the channel layer cannot be reached."""
        sign_in = sign_in_of(self.scope)
        try:
            async with asyncio.timeout(LAYER_TIMEOUT_SECONDS):
                for group in [*groups, sign_in.group] if sign_in else groups:
                    await self.channel_layer.group_add(group, self.channel_name)
                    self.joined.append(group)
        except (redis.RedisError, TimeoutError) as error:
            _layer_outage.began(error)
            await self.refuse(LIVE_UNAVAILABLE)
            return False
        _layer_outage.ended()
        if not self._counted:
            self._counted = True
            metrics.websocket_connections.labels(feed=self.feed).inc()
        if sign_in is not None:
            self._watch = _current_watch()
            self._watch.add(self, sign_in)
        return True

    async def disconnect(self, code: int) -> None:
        """Stop watching the sign-in and leave the groups joined (with Redis down, channels-redis
        lets them expire)."""
        self._unwatch()
        try:
            async with asyncio.timeout(LAYER_TIMEOUT_SECONDS):
                for group in self.joined:
                    await self.channel_layer.group_discard(group, self.channel_name)
        except (redis.RedisError, TimeoutError) as error:
            _layer_outage.began(error)
        self.joined = []

    async def sign_in_ended(self, message: dict[str, Any] | None = None) -> None:
        """`sign_in.ended`, or the re-check found the key revoked or the session signed out."""
        self._unwatch()
        with contextlib.suppress(*_CLIENT_GONE):  # the re-check may come just after the client left
            await self.close(code=SIGNED_OUT)

    def _unwatch(self) -> None:
        if self._watch is not None:
            self._watch.discard(self)
            self._watch = None

    async def accept(self, subprotocol: str | None = None, headers: Any = None) -> None:
        await super().accept(subprotocol, headers)
        self.accepted = True

    async def send_json(self, content: Any, close: bool = False) -> None:
        """Send unless the socket was closed meanwhile (what a handler sends after its sign-in
        ended is dropped)."""
        async with self._sending:
            if self.closed:
                return
            await super().send_json(content)
        if close:
            await self.close()

    async def close(self, code: int | None = None, reason: str | None = None) -> None:
        async with self._sending:
            if self.closed:
                return
            self.closed = True
            await super().close(code=code, reason=reason)

    async def refuse(self, code: int) -> None:
        """Close the socket with `code` as soon as it opens: closed during the handshake, a browser
        would only see the server's HTTP 403, never the code that says why."""
        await refuse(self, code)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """Clients send only small JSON frames (a ping): a binary, oversized or unreadable one closes
        the socket with 4400 instead of failing in the consumer."""
        try:
            if text_data is None or len(text_data) > MAX_CLIENT_FRAME:
                raise ValueError("not a small text frame")
            content = await self.decode_json(text_data)
        except (ValueError, RecursionError):
            await self.close(code=4400)
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients only listen; a ping gets a pong, with the last seq sent on an ordered feed, so
        they can check the link."""
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong", "seq": getattr(self, "last_seq", 0)})

    async def live_event(self, message: dict[str, Any]) -> None:
        raise NotImplementedError

    async def live_events(self, message: dict[str, Any]) -> None:
        for event in message["events"]:
            await self.live_event({"event": event})


class NoRoute(AsyncWebsocketConsumer):
    """Any websocket path that is not one of ours (or not a thread id): refused with 4404, as a
    thread the caller may not see is, instead of the router's error."""

    async def connect(self) -> None:
        await refuse(self, 4404)


async def refuse(consumer: AsyncWebsocketConsumer, code: int) -> None:
    """Accept the handshake, then close with `code` (see EventConsumer.refuse)."""
    await consumer.accept()
    await consumer.close(code=code)


_server_loop: asyncio.AbstractEventLoop | None = None


def register_server_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Remember the ASGI server's event loop (consumers call this when they connect).

    The in-memory channel layer's queues belong to that loop, so events are sent from it;
    channels-redis works from any loop, and a process without websockets has none.
    """
    global _server_loop
    _server_loop = loop


@dataclass(frozen=True)
class _Queued:
    """An item on the publisher's queue: a message for `group`, when it was committed (for the
    publish lag) and the trace context of the write that made it (empty without tracing)."""

    group: str
    payload: dict[str, Any]
    committed: float = 0.0
    trace: dict[str, str] = field(default_factory=dict)


class _Publisher:
    """One thread per process that sends queued events, in order."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Queued] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def send(self, group: str, payload: dict[str, Any], *, trace: dict[str, str] | None = None) -> None:
        self._ensure_started()
        self._queue.put(_Queued(group, payload, time.monotonic(), trace or {}))

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything queued so far has been sent (tests use it)."""
        done = threading.Event()
        self.send("", {"__flush__": done})
        done.wait(timeout)

    def _ensure_started(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="live-publisher", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        own_loop = asyncio.new_event_loop()
        while True:
            # Whatever queued up while the last send was on its way goes out together: one
            # message per group instead of one per event, so a busy writer costs the
            # publisher (and the GIL it shares with the writer) a send per batch.
            batches: dict[str, list[_Queued]] = {}
            for item in self._drain():
                if _AS_IS in item.payload:
                    self._send(get_channel_layer(), item.group, item.payload[_AS_IS], own_loop)
                    continue
                flushed = item.payload.get("__flush__")
                if flushed is None:
                    batches.setdefault(item.group, []).append(item)
                    continue
                self._send_all(batches, own_loop)
                batches = {}
                flushed.set()
            self._send_all(batches, own_loop)

    def _drain(self) -> list[_Queued]:
        """The next queued item (waiting for one), then up to BATCH - 1 more queued by the end of
        the linger."""
        items = [self._queue.get()]
        time.sleep(LINGER_SECONDS)
        try:
            while len(items) < BATCH:
                items.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return items

    def _send_all(self, batches: dict[str, list[_Queued]], own_loop: asyncio.AbstractEventLoop) -> None:
        layer = get_channel_layer() if batches else None
        if layer is None:
            return
        for group, items in batches.items():
            events = [item.payload for item in items]
            message: dict[str, Any] = (
                {"type": "live.event", "event": events[0]}
                if len(events) == 1
                else {"type": "live.events", "events": events}
            )
            traces = [item.trace for item in items if item.trace]
            with telemetry.span("quicksave.live.publish", carrier=traces[0] if traces else None, links=traces[1:],
                                kind=SpanKind.PRODUCER, attributes={"quicksave.events": len(events)}):  # fmt: skip
                if traces:
                    # The sockets' server process continues the trace under this send (EventConsumer.dispatch).
                    message["trace"] = telemetry.current_carrier()
                sent = self._send(layer, group, message, own_loop)
            if sent:
                now = time.monotonic()
                for item in items:
                    metrics.live_publish_lag_seconds.observe(now - item.committed)
        # One message for the whole round tells the thread list which of its rows may have changed.
        changed = sorted(
            items[0].payload["thread"] for group, items in batches.items() if group.startswith(_THREAD_GROUP_PREFIX)
        )
        if changed:
            self._send(layer, THREADS_GROUP, {"type": "live.threads", "threads": changed}, own_loop)

    @staticmethod
    def _send(layer: Any, group: str, message: dict[str, Any], own_loop: asyncio.AbstractEventLoop) -> bool:
        """Send `message` to `group`; False (logged, counted) when the channel layer failed."""
        if layer is None:
            return False
        send = layer.group_send(group, message)
        try:
            server_loop = _server_loop
            if server_loop is not None and server_loop.is_running():
                asyncio.run_coroutine_threadsafe(send, server_loop).result(timeout=5)
            else:
                own_loop.run_until_complete(send)
        except redis.RedisError as error:  # Redis down: clients catch up from the Event table
            metrics.live_publish_failures_total.inc()
            _layer_outage.began(error)
        except Exception:
            metrics.live_publish_failures_total.inc()
            log.warning("could not publish to %s", group, exc_info=True)
        else:
            _layer_outage.ended()
            return True
        return False


_publisher = _Publisher()


def publish_on_commit(
    *, thread_id: UUID | str, seq: int, type: str, data: dict[str, Any], agent: str | None = None
) -> None:
    """Send the event to its websocket groups once the current transaction commits."""
    # The writer's trace context, taken now: the commit may run its callbacks under another span.
    transaction.on_commit(functools.partial(publish, thread_id=thread_id, seq=seq, type=type, data=data, agent=agent,
                                            trace=telemetry.current_carrier()))  # fmt: skip


def publish(
    *,
    thread_id: UUID | str,
    seq: int,
    type: str,
    data: dict[str, Any],
    agent: str | None = None,
    trace: dict[str, str] | None = None,
) -> None:
    """Send a committed event to its websocket groups (publish_on_commit waits for the commit)."""
    if type == CHECKPOINT_CREATED:
        metrics.checkpoint_writes_total.inc()
    payload = message(thread_id=thread_id, seq=seq, type=type, data=data)
    _publisher.send(thread_group(thread_id), payload, trace=trace)
    if type in INBOX_TYPES:
        _publisher.send(INBOX_GROUP, {**payload, "agent": agent}, trace=trace)
    for listener in _listeners:
        try:
            listener(payload)
        except Exception:  # a listener's fault is not the writer's: its commit stands
            log.warning("a listener of committed events failed", exc_info=True)


# Who else hears of each committed event (the GenAI export, checkpoints.genai_live): called in the
# writer's thread just after its commit, so a listener only queues the event for a thread of its own.
_listeners: list[Callable[[dict[str, Any]], None]] = []


def listen(listener: Callable[[dict[str, Any]], None]) -> None:
    """Call `listener(event)` with every event this process commits (once per listener)."""
    if listener not in _listeners:
        _listeners.append(listener)


def close_sockets_on_commit(group: str) -> None:
    """Once the current transaction commits, close the sockets in `group` (agent_key_group,
    session_group) with 4401 on every server process. A process that misses the message closes
    them at its next re-check of their sign-ins."""
    transaction.on_commit(functools.partial(_publisher.send, group, {_AS_IS: {"type": "sign_in.ended"}}))


def close_session_sockets(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    """On `user_logged_out`: close the sockets the signed-out browser session opened."""
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if session_key:
        close_sockets_on_commit(session_group(session_key))


def flush(timeout: float = 5.0) -> None:
    _publisher.flush(timeout)
