"""Memory's websockets: one blackboard's events (replay what a client missed, then forward live
ones in order: checkpoints.sockets.OrderedFeed, as a thread's socket), for agents whose key may use
the board and people with the viewer role; and the changes of items under a namespace, which the
memory browser's open pages follow (memory.changes), for people with the viewer role."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from rest_framework.exceptions import PermissionDenied

from checkpoints import sockets
from checkpoints.consumers import after_seq
from memory import access, boards, changes, spaces
from memory.access import Scope, scope_for_reading
from memory.errors import MemoryStoreError
from memory.paths import Path, item_key, namespace_path, parse_dotted

# How long a check that the socket's agent may still use the board holds: a revoked grant closes
# the socket (4404) before the first event it sends this long after the revocation.
ACCESS_RECHECK_SECONDS = 1.0


def _board(principal: Any, dotted: str) -> tuple[spaces.Space, Scope] | int:
    """The board and the caller's scope, or the close code that refuses the socket."""
    try:
        scope = scope_for_reading(principal)
    except PermissionDenied:
        return 4403
    try:
        return boards.board_for(parse_dotted(dotted), scope), scope
    except MemoryStoreError:
        return 4404


class BoardConsumer(sockets.OrderedFeed):
    """`/ws/memory/boards/{namespace}/?after_seq=N`: the board's events with seq > N from the table,
    then live ones; a gap in seq replays from the table."""

    feed = "board"

    async def connect(self) -> None:
        if (user := await self.signed_in()) is None:
            return
        found = await database_sync_to_async(_board)(user, self.scope["url_route"]["kwargs"]["namespace"])
        if isinstance(found, int):
            await self.refuse(found)
            return
        start = after_seq(self.scope)
        if start is None:
            await self.refuse(4400)
            return
        (self.space, self.memory_scope), self.last_seq = found, start
        self.checked_at = time.monotonic()
        if not await self.join(boards.group(self.space.id)):
            return
        await self.accept()
        await self.replay()

    async def events_after(self, seq: int, limit: int) -> list[dict[str, Any]]:
        return await database_sync_to_async(boards.events_after)(space=self.space, seq=seq, limit=limit)

    async def still_allowed(self) -> bool:
        """False once the grant that let this agent see the board is revoked (checked at most every
        ACCESS_RECHECK_SECONDS)."""
        if time.monotonic() - self.checked_at < ACCESS_RECHECK_SECONDS:
            return True
        allowed = await database_sync_to_async(access.may_use)(self.memory_scope, self.space)
        self.checked_at = time.monotonic()
        return allowed


@dataclass(frozen=True, slots=True)
class Watched:
    """What a page shows: the items under `prefix` (or the one at `key` in it), as of `since`."""

    prefix: Path
    key: str | None
    since: datetime


def watched(query_string: bytes) -> Watched | None:
    """The page's `ns` (once per label), `key` and `since` (an ISO 8601 time with its offset);
    None when one is malformed."""
    query = parse_qs(query_string.decode(errors="replace"), keep_blank_values=True)
    try:
        prefix = namespace_path(query.get("ns", []), allow_empty=True)
        key = item_key(query["key"][-1]) if "key" in query else None
        since = datetime.fromisoformat(query.get("since", [""])[-1])
    except (MemoryStoreError, ValueError):
        return None
    if since.tzinfo is None:
        return None
    return Watched(prefix=prefix, key=key, since=since)


def _may_browse(principal: Any) -> bool:
    return isinstance(principal, User) and principal.has_perm(access.VIEW)


class PageConsumer(sockets.EventConsumer):
    """`/ws/memory/?ns=<label>&…[&key=<key>]&since=<time>`: a `memory.changed` first if anything
    the page shows changed since it was rendered, then each `item.written` and `item.deleted`
    under the namespace (of the key). Pages fetch themselves again on either, and after a
    reconnect (what was missed meanwhile)."""

    feed = "memory"

    async def connect(self) -> None:
        if (user := await self.signed_in()) is None:
            return
        if not await database_sync_to_async(_may_browse)(user):
            await self.refuse(4403)
            return
        page = watched(self.scope.get("query_string", b""))
        if page is None:
            await self.refuse(4400)
            return
        self.page = page
        if not await self.join(changes.GROUP):
            return
        await self.accept()
        if await database_sync_to_async(changes.changed_since)(prefix=page.prefix, key=page.key, since=page.since):
            await self.send_json(
                {"type": changes.CHANGED, "seq": 0, "namespace": list(page.prefix), "key": page.key, "data": {}}
            )

    async def live_event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        if changes.concerns(event, prefix=self.page.prefix, key=self.page.key):
            await self.send_json(event)
