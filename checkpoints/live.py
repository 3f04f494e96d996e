"""Live updates: events go out to websocket groups after their transaction commits.

The Event table is the source of truth; the channel layer only makes delivery fast.
A process hands each committed event to one publisher thread (a queue, so the
writer never waits on Redis), which sends them in order to the thread's group and,
for approvals, to the inbox group. An event lost on the way (a process killed, Redis
down) is not lost to clients: they notice the gap in `seq` and replay from the table.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any
from uuid import UUID

from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

INBOX_GROUP = "inbox"
INBOX_TYPES = frozenset({"approval.requested", "approval.decided"})


def thread_group(thread_id: UUID | str) -> str:
    return f"thread.{thread_id}"


def message(*, thread_id: UUID | str, seq: int, type: str, data: dict[str, Any]) -> dict[str, Any]:
    """An event as websocket clients receive it (PRODUCT.md's shape)."""
    return {"type": type, "seq": seq, "thread": str(thread_id), "data": data}


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
            group, payload = self._queue.get()
            flushed = payload.get("__flush__")
            if flushed is not None:
                flushed.set()
                continue
            layer = get_channel_layer()
            if layer is None:
                continue
            send = layer.group_send(group, {"type": "live.event", "event": payload})
            try:
                server_loop = _server_loop
                if server_loop is not None and server_loop.is_running():
                    asyncio.run_coroutine_threadsafe(send, server_loop).result(timeout=5)
                else:
                    own_loop.run_until_complete(send)
            except Exception:  # Redis down: clients catch up from the Event table
                log.warning("could not publish %s to %s", payload.get("type"), group, exc_info=True)


_publisher = _Publisher()


def publish_on_commit(
    *, thread_id: UUID | str, seq: int, type: str, data: dict[str, Any], agent: str | None = None
) -> None:
    """Send the event to its websocket groups once the current transaction commits."""
    payload = message(thread_id=thread_id, seq=seq, type=type, data=data)

    def send() -> None:
        _publisher.send(thread_group(thread_id), payload)
        if type in INBOX_TYPES:
            _publisher.send(INBOX_GROUP, {**payload, "agent": agent})

    transaction.on_commit(send)


def flush(timeout: float = 5.0) -> None:
    _publisher.flush(timeout)
