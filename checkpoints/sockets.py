"""The websockets that receive live events (`checkpoints.live` publishes them): the consumers'
base class, its sign-in watch, and the refusal of a path that is not ours.

A socket lasts as long as the sign-in it was opened with: revoking its agent key or signing
its browser session out closes it with 4401 on every server process (a `sign_in.ended`
message to the key's or session's group, and, in case that message is lost, a re-check of
every open socket's sign-in once a second). While the channel layer cannot be reached,
sockets are refused (or closed) with 4503, and the outage is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from importlib import import_module
from typing import Any, ClassVar, Generic, Self, TypeVar

import redis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone
from opentelemetry.trace import SpanKind

from checkpoints.live import (
    Outage,
    agent_key_group,
    layer_outage,
    listening,
    not_listening,
    register_server_loop,
    session_group,
)
from quicksave import metrics, telemetry
from quicksave_agents.models import AgentKey

log = logging.getLogger(__name__)

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
# What the ASGI server raises on a send to a client that has left (uvicorn: ClientDisconnected, an
# OSError, or a RuntimeError for a close after the disconnect).
_CLIENT_GONE = (OSError, RuntimeError)

# A watch's sockets and the note it keeps of each (Watch).
WatchedT = TypeVar("WatchedT")
NoteT = TypeVar("NoteT")

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
    # A quicksave_agents.auth.AgentPrincipal, known by its key.
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


_recheck_outage = Outage(
    "Checking the sign-ins of open websockets", "they stay open until a check succeeds or a sign-out message arrives"
)


class Watch(ABC, Generic[WatchedT, NoteT]):
    """The open sockets of one event loop that need the same check, made for all of them at once
    every `interval()` seconds (one database round, where a query per socket would not scale).

    Its task runs while a socket is watched and ends with the last one; the next starts it again.
    Sockets are held weakly, each with a note of what its check needs: one whose task was cancelled
    (no disconnect) just disappears. A subclass says what a round does (`check`); `current()` is
    its one watch on the running loop (a server has one loop; tests run one per test).
    """

    _current: ClassVar[dict[type[Watch[Any, Any]], Watch[Any, Any]]] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.sockets: weakref.WeakKeyDictionary[WatchedT, NoteT] = weakref.WeakKeyDictionary()
        self.task: asyncio.Task[None] | None = None

    @classmethod
    def current(cls) -> Self:
        loop = asyncio.get_running_loop()
        watch = Watch._current.get(cls)
        if not isinstance(watch, cls) or watch.loop is not loop:
            watch = Watch._current[cls] = cls(loop)
        return watch

    def add(self, consumer: WatchedT, note: NoteT) -> None:
        self.sockets[consumer] = note
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self._run())

    def discard(self, consumer: WatchedT) -> None:
        self.sockets.pop(consumer, None)

    @abstractmethod
    def interval(self) -> float:
        """Seconds between rounds."""

    @abstractmethod
    async def check(self, watched: dict[WatchedT, NoteT]) -> None:
        """One round over the sockets watched when it began (with their notes)."""

    async def _run(self) -> None:
        while self.sockets:
            await asyncio.sleep(self.interval())
            if watched := dict(self.sockets):
                await self.check(watched)


class _SignInWatch(Watch["EventConsumer", SignIn]):
    """Open sockets by the sign-in each needs: a socket whose sign-in no longer holds is closed."""

    def interval(self) -> float:
        return RECHECK_SECONDS

    async def check(self, watched: dict[EventConsumer, SignIn]) -> None:
        try:
            ended = await database_sync_to_async(ended_sign_ins)(set(watched.values()))
        except Exception as error:  # the database is down: keep watching, and say so once
            _recheck_outage.began(error)
            return
        _recheck_outage.ended()
        for consumer, sign_in in watched.items():
            if sign_in in ended:
                await consumer.sign_in_ended()


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
        self.noted: list[str] = []  # the groups noted as listened to (checkpoints.live.listening)
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
            layer_outage.began(error)
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
                wanted = [*groups, sign_in.group] if sign_in else list(groups)
                # Noted before joining, as the publisher skips a group no socket has noted: a send
                # it then makes reaches this socket once it has joined, or its replay reads the event.
                await asyncio.to_thread(listening, wanted, self.channel_name, layer=self.channel_layer)
                self.noted.extend(wanted)
                for group in wanted:
                    await self.channel_layer.group_add(group, self.channel_name)
                    self.joined.append(group)
        except (redis.RedisError, TimeoutError) as error:
            layer_outage.began(error)
            await self.refuse(LIVE_UNAVAILABLE)
            return False
        layer_outage.ended()
        if not self._counted:
            self._counted = True
            metrics.websocket_connections.labels(feed=self.feed).inc()
        if sign_in is not None:
            self._watch = _SignInWatch.current()
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
                await asyncio.to_thread(not_listening, self.noted, self.channel_name, layer=self.channel_layer)
        except (redis.RedisError, TimeoutError) as error:
            layer_outage.began(error)
        self.joined, self.noted = [], []

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


class OrderedFeed(EventConsumer):
    """A socket of one ordered feed (a thread's events, a board's): `replay` sends the events after
    the client's `last_seq` from the table, in batches; then live events are forwarded in order,
    one already sent is dropped, and a gap (an event lost on the way) replays from the table.

    Consumers handle one message at a time, so live events that arrive during the replay wait
    their turn. A subclass reads the table (`events_after`) and may stop following (`still_allowed`:
    False closes the socket with 4404 before the next event)."""

    REPLAY_BATCH = 500
    last_seq = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Live events, the replay on connect and a catch-up from another task (the thread sockets'
        # tail watch) take turns: each sends in seq order.
        self._in_order = asyncio.Lock()

    async def events_after(self, seq: int, limit: int) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def still_allowed(self) -> bool:
        return True

    async def live_event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        async with self._in_order:
            if event["seq"] <= self.last_seq:
                return
            if not await self.still_allowed():
                await self.close(code=4404)
                return
            if event["seq"] > self.last_seq + 1:
                await self._replay()  # something was missed on the way: the table has it
                return
            await self._forward(event)

    async def replay(self) -> None:
        """Send what the table holds after `last_seq`."""
        async with self._in_order:
            await self._replay()

    async def catch_up(self, latest: int) -> None:
        """The feed's events reach `latest`: replay those that have not come live."""
        async with self._in_order:
            if latest > self.last_seq and not self.closed:
                await self._replay()

    async def _replay(self) -> None:
        while True:
            events = await self.events_after(self.last_seq, self.REPLAY_BATCH)
            for event in events:
                await self._forward(event)
            if len(events) < self.REPLAY_BATCH:
                return

    async def _forward(self, event: dict[str, Any]) -> None:
        self.last_seq = event["seq"]
        await self.send_json(event)


class NoRoute(AsyncWebsocketConsumer):
    """Any websocket path that is not one of ours (or not a thread id): refused with 4404, as a
    thread the caller may not see is, instead of the router's error."""

    async def connect(self) -> None:
        await refuse(self, 4404)


async def refuse(consumer: AsyncWebsocketConsumer, code: int) -> None:
    """Accept the handshake, then close with `code` (see EventConsumer.refuse)."""
    await consumer.accept()
    await consumer.close(code=code)
