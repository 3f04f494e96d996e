"""Websocket for one thread: replay the events a client missed, then forward live ones in order."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async

from checkpoints import live, sockets, storage
from checkpoints.access import visible_threads
from quicksave import logs

REPLAY_BATCH = 500


def _can_view(principal: Any, thread_id: str) -> bool:
    return visible_threads(principal).filter(pk=thread_id).exists()


def _events_after(thread_id: str, seq: int) -> list[dict[str, Any]]:
    events = storage.events_after(thread_id=thread_id, seq=seq, limit=REPLAY_BATCH)
    return [live.message(thread_id=thread_id, seq=number, type=kind, data=data) for number, kind, data in events]


def after_seq(scope: dict[str, Any]) -> int | None:
    """The `after_seq` query parameter: 0 when absent, None when malformed."""
    values = parse_qs(scope.get("query_string", b"").decode()).get("after_seq", ["0"])
    try:
        seq = int(values[-1])
    except ValueError:
        return None
    return seq if seq >= 0 else None


class ThreadConsumer(sockets.EventConsumer):
    """`/ws/threads/{id}/?after_seq=N`: events with seq > N from the table, then live ones.

    Consumers handle one message at a time, so live events that arrive during the
    replay wait their turn; `last_seq` drops duplicates and a gap triggers a replay.
    """

    feed = "thread"

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
        await self._replay()

    async def live_event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        if event["seq"] <= self.last_seq:
            return
        if event["seq"] > self.last_seq + 1:
            await self._replay()  # something was missed on the way: the table has it
            return
        await self._send(event)

    async def _replay(self) -> None:
        while True:
            events = await database_sync_to_async(_events_after)(self.thread_id, self.last_seq)
            for event in events:
                await self._send(event)
            if len(events) < REPLAY_BATCH:
                return

    async def _send(self, event: dict[str, Any]) -> None:
        self.last_seq = event["seq"]
        await self.send_json(event)


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
