"""Websocket for one thread: replay the events a client missed, then forward live ones in order.

The channel layer can lose a message (a server's list over its capacity, Redis restarting). A
lost event followed by another is noticed by the gap in `seq`; one that nothing follows (a
thread's last events) is noticed by the tail watch: every QUICKSAVE_LIVE_RECHECK_SECONDS, one
query per server process compares each open thread socket's last seq with its thread's event
counter, and a socket behind it replays from the table.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.conf import settings

from checkpoints import live, sockets, storage
from checkpoints.access import visible_threads
from checkpoints.models import Thread
from quicksave import logs

log = logging.getLogger(__name__)


def _can_view(principal: Any, thread_id: str) -> bool:
    return visible_threads(principal).filter(pk=thread_id).exists()


def _events_after(thread_id: str, seq: int, limit: int) -> list[dict[str, Any]]:
    events = storage.events_after(thread_id=thread_id, seq=seq, limit=limit)
    return [live.message(thread_id=thread_id, seq=number, type=kind, data=data) for number, kind, data in events]


def after_seq(scope: dict[str, Any]) -> int | None:
    """The `after_seq` query parameter: 0 when absent, None when malformed."""
    values = parse_qs(scope.get("query_string", b"").decode()).get("after_seq", ["0"])
    try:
        seq = int(values[-1])
    except ValueError:
        return None
    return seq if seq >= 0 else None


class ThreadConsumer(sockets.OrderedFeed):
    """`/ws/threads/{id}/?after_seq=N`: events with seq > N from the table, then live ones."""

    feed = "thread"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.thread_id = ""

    async def connect(self) -> None:
        self.thread_id = str(self.scope["url_route"]["kwargs"]["thread_id"])
        logs.bind_thread(self.thread_id)  # this socket's task: every line it logs names the thread
        if (user := await self.signed_in()) is None:
            return
        if not await database_sync_to_async(_can_view)(user, self.thread_id):
            await self.refuse(4404)
            return
        start = after_seq(self.scope)
        if start is None:
            await self.refuse(4400)
            return
        self.last_seq = start
        if not await self.join(live.thread_group(self.thread_id)):
            return
        await self.accept()
        await self.replay()
        _TailWatch.current().add(self, None)

    async def disconnect(self, code: int) -> None:
        _TailWatch.current().discard(self)
        await super().disconnect(code)

    async def events_after(self, seq: int, limit: int) -> list[dict[str, Any]]:
        return await database_sync_to_async(_events_after)(self.thread_id, seq, limit)


def _latest_event_seqs(thread_ids: set[str]) -> dict[str, int]:
    return {str(pk): seq for pk, seq in Thread.objects.filter(pk__in=thread_ids).values_list("pk", "event_seq")}


class _TailWatch(sockets.Watch[ThreadConsumer, None]):
    """Thread sockets, checked against their threads' event counters in one query: a socket the
    counter has passed catches up."""

    def interval(self) -> float:
        return float(settings.QUICKSAVE_LIVE_RECHECK_SECONDS)

    async def check(self, watched: dict[ThreadConsumer, None]) -> None:
        try:
            latest = await database_sync_to_async(_latest_event_seqs)({c.thread_id for c in watched})
        except Exception:  # the database is down: the next round tries again
            log.warning("could not check the open thread sockets against their threads", exc_info=True)
            return
        behind = [c for c in watched if latest.get(c.thread_id, 0) > c.last_seq]
        await asyncio.gather(*(c.catch_up(latest[c.thread_id]) for c in behind), return_exceptions=True)


def _sees_every_thread(principal: Any) -> bool:
    return bool(getattr(principal, "is_authenticated", False) and principal.has_perm("checkpoints.view_thread"))


class ThreadListConsumer(sockets.EventConsumer):
    """`/ws/threads/`: for the dashboard's thread list, `threads.changed` naming the threads that had
    events, at most every `live.THREADS_INTERVAL_SECONDS`. For people who may read every thread; an
    agent key lists its threads through the API."""

    feed = "threads"

    async def connect(self) -> None:
        if (user := await self.signed_in()) is None:
            return
        if not await database_sync_to_async(_sees_every_thread)(user):
            await self.refuse(4403)
            return
        if not await self.join(live.THREADS_GROUP):
            return
        await self.accept()

    async def live_threads(self, message: dict[str, Any]) -> None:
        await self.send_json(
            {"type": "threads.changed", "seq": 0, "thread": None, "data": {"threads": message["threads"]}}
        )
