"""Live updates: events go out to websocket groups after their transaction commits.

The Event table is the source of truth; the channel layer only makes delivery fast.
A process hands each committed event to one publisher thread (a queue, so the
writer never waits on Redis), which sends them in order to the thread's group and,
for approvals, to the inbox group: one `live.event` message, or one `live.events`
message carrying the events that queued up while the previous send was under way.
An event lost on the way (a process killed, Redis down) is not lost to clients: they
notice the gap in `seq` and replay from the table.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
from typing import Any
from uuid import UUID

import redis
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.db import transaction

log = logging.getLogger(__name__)

INBOX_GROUP = "inbox"
# The thread list's group: after each publisher round, the ids of the threads that had events.
THREADS_GROUP = "threads"
_THREAD_GROUP_PREFIX = "thread."
INBOX_TYPES = frozenset({"approval.requested", "approval.decided"})
# At most this many queued events go out in one publisher round.
BATCH = 200
# A round waits this long after its first event for more to join it: a writer appending
# hundreds of checkpoints a second then costs the publisher (and the GIL it shares with the
# writer) one round per few events, for a delay no one watching a page can see.
LINGER_SECONDS = 0.005


def thread_group(thread_id: UUID | str) -> str:
    return f"{_THREAD_GROUP_PREFIX}{thread_id}"


def message(*, thread_id: UUID | str, seq: int, type: str, data: dict[str, Any]) -> dict[str, Any]:
    """An event as websocket clients receive it (PRODUCT.md's shape)."""
    return {"type": type, "seq": seq, "thread": str(thread_id), "data": data}


# The largest frame a client may send (a ping is a few dozen bytes).
MAX_CLIENT_FRAME = 4096


class EventConsumer(AsyncJsonWebsocketConsumer):
    """A websocket that receives the publisher's messages: `live.event` goes to `live_event`,
    which a consumer defines; `live.events` (a batch) hands it each event in order."""

    async def signed_in(self) -> Any | None:
        """The principal connecting (a person or an agent key), after noting the server's loop;
        None, with the socket refused with 4401, when nobody is signed in."""
        register_server_loop(asyncio.get_running_loop())
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(4401)
            return None
        return user

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


class _Publisher:
    """One thread per process that sends queued events, in order."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[str, dict[str, Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def send(self, group: str, payload: dict[str, Any]) -> None:
        self._ensure_started()
        self._queue.put((group, payload))

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
            batches: dict[str, list[dict[str, Any]]] = {}
            for group, payload in self._drain():
                flushed = payload.get("__flush__")
                if flushed is None:
                    batches.setdefault(group, []).append(payload)
                    continue
                self._send_all(batches, own_loop)
                batches = {}
                flushed.set()
            self._send_all(batches, own_loop)

    def _drain(self) -> list[tuple[str, dict[str, Any]]]:
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

    def _send_all(self, batches: dict[str, list[dict[str, Any]]], own_loop: asyncio.AbstractEventLoop) -> None:
        layer = get_channel_layer() if batches else None
        if layer is None:
            return
        for group, events in batches.items():
            if len(events) == 1:
                self._send(layer, group, {"type": "live.event", "event": events[0]}, own_loop)
            else:
                self._send(layer, group, {"type": "live.events", "events": events}, own_loop)
        # One message for the whole round tells the thread list which of its rows may have changed.
        changed = sorted(
            events[0]["thread"] for group, events in batches.items() if group.startswith(_THREAD_GROUP_PREFIX)
        )
        if changed:
            self._send(layer, THREADS_GROUP, {"type": "live.threads", "threads": changed}, own_loop)

    @staticmethod
    def _send(layer: Any, group: str, message: dict[str, Any], own_loop: asyncio.AbstractEventLoop) -> None:
        if not _may_have_listeners(layer, group):
            return
        send = layer.group_send(group, message)
        try:
            server_loop = _server_loop
            if server_loop is not None and server_loop.is_running():
                asyncio.run_coroutine_threadsafe(send, server_loop).result(timeout=5)
            else:
                own_loop.run_until_complete(send)
        except Exception:  # Redis down: clients catch up from the Event table
            log.warning("could not publish to %s", group, exc_info=True)


def _may_have_listeners(layer: Any, group: str) -> bool:
    """False only when a group certainly has no member, so its send can be skipped.

    channels-redis keeps a group's members in a sorted set; its size is one synchronous
    round trip, where `group_send` to an empty group is two asynchronous ones, and most
    groups a busy writer sends to have nobody watching. A socket joining just after the
    check misses nothing: it joins its group before it replays the Event table. The in-memory
    layer's groups are in this process, so they are looked at directly. Any doubt (another
    layer, another host layout, an error) says yes.
    """
    if isinstance(layer, InMemoryChannelLayer):
        return bool(layer.groups.get(group))
    if not isinstance(layer, RedisChannelLayer) or len(layer.hosts) != 1 or "address" not in layer.hosts[0]:
        return True
    try:
        return bool(_redis_client(layer.hosts[0]["address"]).zcard(layer._group_key(group)))
    except redis.RedisError:
        return True


@functools.cache
def _redis_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


_publisher = _Publisher()


def publish_on_commit(
    *, thread_id: UUID | str, seq: int, type: str, data: dict[str, Any], agent: str | None = None
) -> None:
    """Send the event to its websocket groups once the current transaction commits."""
    transaction.on_commit(functools.partial(publish, thread_id=thread_id, seq=seq, type=type, data=data, agent=agent))


def publish(*, thread_id: UUID | str, seq: int, type: str, data: dict[str, Any], agent: str | None = None) -> None:
    """Send a committed event to its websocket groups (publish_on_commit waits for the commit)."""
    payload = message(thread_id=thread_id, seq=seq, type=type, data=data)
    _publisher.send(thread_group(thread_id), payload)
    if type in INBOX_TYPES:
        _publisher.send(INBOX_GROUP, {**payload, "agent": agent})


def flush(timeout: float = 5.0) -> None:
    _publisher.flush(timeout)
