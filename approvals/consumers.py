"""Websocket for the inbox: the pending approvals on connect, then every request and decision live.

The channel layer can lose a message (a server's list over its capacity, Redis restarting), and the
inbox mixes threads, so no gap in `seq` shows a lost event. The inbox watch does instead: every
QUICKSAVE_LIVE_RECHECK_SECONDS, one query per server process reads the pending approvals, and a
socket whose pending set differs from the table's gets a fresh `inbox.sync`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints import live, sockets
from checkpoints.access import visible_threads
from quicksave_agents.auth import AgentPrincipal

log = logging.getLogger(__name__)


def _pending(principal: Any) -> list[str]:
    return [
        str(pk)
        for pk in ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, thread__in=visible_threads(principal))
        .order_by("created_at")
        .values_list("pk", flat=True)
    ]


def _every_pending() -> list[tuple[str, str]]:
    """Every pending approval, oldest first, with its thread's agent: (approval id, agent name)."""
    rows = (
        ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING)
        .order_by("created_at")
        .values_list("pk", "thread__agent__name")
    )
    return [(str(pk), agent) for pk, agent in rows]


def _sees_everything(principal: Any) -> bool:
    return bool(principal.has_perm("checkpoints.view_thread"))


class InboxConsumer(sockets.EventConsumer):
    """`/ws/inbox/`: first an `inbox.sync` with the pending approval ids (a reconnecting client
    reconciles with it), then `approval.requested` / `approval.decided` events as they commit; a
    later `inbox.sync` when the inbox watch finds an event lost on the way."""

    feed = "inbox"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent: str | None = None
        # The pending approvals the client was told of, and the inbox events handled so far (the
        # watch leaves a socket alone for a round in which one arrived: its query may predate it).
        self.pending: set[str] = set()
        self.handled = 0
        # Requests a sync named whose own event may still be on its way: not sent a second time.
        self.synced: set[str] = set()

    async def connect(self) -> None:
        if (user := await self.signed_in()) is None:
            return
        self.agent = user.agent.name if isinstance(user, AgentPrincipal) else None
        if self.agent is None and not await database_sync_to_async(_sees_everything)(user):
            await self.refuse(4403)
            return
        if not await self.join(live.INBOX_GROUP):
            return
        await self.accept()
        await self.sync(await database_sync_to_async(_pending)(user))
        _InboxWatch.current().add(self, None)

    async def disconnect(self, code: int) -> None:
        _InboxWatch.current().discard(self)
        await super().disconnect(code)

    async def sync(self, pending: list[str]) -> None:
        """Send the pending approval ids. A request that committed just before may still be on its
        way through the channel layer; the sync already names it, so its event is not sent again."""
        named = set(pending)
        self.synced = (named - self.pending) | (self.synced & named)
        self.pending = named
        await self.send_json({"type": "inbox.sync", "seq": 0, "thread": None, "data": {"pending": pending}})

    def sees(self, agent: str | None) -> bool:
        """An agent key sees its own agent's approvals only."""
        return self.agent is None or agent == self.agent

    async def live_event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        if not self.sees(event.get("agent")):
            return
        self.handled += 1
        approval = event["data"].get("approval")
        if event["type"] == "approval.requested" and approval in self.synced:
            self.synced.discard(approval)
            return
        if event["type"] == "approval.requested" and event["data"].get("status") == ApprovalStatus.PENDING:
            self.pending.add(approval)
        elif event["type"] == "approval.decided":
            self.pending.discard(approval)
        await self.send_json({key: event[key] for key in ("type", "seq", "thread", "data")})


class _InboxWatch(sockets.Watch[InboxConsumer, None]):
    """Inbox sockets, checked against the pending approvals in one query: a socket told of others
    gets a fresh `inbox.sync`."""

    def interval(self) -> float:
        return float(settings.QUICKSAVE_LIVE_RECHECK_SECONDS)

    async def check(self, watched: dict[InboxConsumer, None]) -> None:
        handled = {consumer: consumer.handled for consumer in watched}
        try:
            pending = await database_sync_to_async(_every_pending)()
        except Exception:  # the database is down: the next round tries again
            log.warning("could not check the open inbox sockets against the pending approvals", exc_info=True)
            return
        for consumer, before in handled.items():
            theirs = [approval for approval, agent in pending if consumer.sees(agent)]
            # A socket that handled an event meanwhile may know more than the query: it waits a round.
            if consumer.handled == before and not consumer.closed and set(theirs) != consumer.pending:
                with contextlib.suppress(OSError, RuntimeError):  # the client left meanwhile
                    await consumer.sync(theirs)
