"""Websocket for the inbox: the pending approvals on connect, then every request and decision live."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints import live, sockets
from checkpoints.access import visible_threads
from quicksave_agents.auth import AgentPrincipal


def _pending(principal: Any) -> list[str]:
    return [
        str(pk)
        for pk in ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, thread__in=visible_threads(principal))
        .order_by("created_at")
        .values_list("pk", flat=True)
    ]


def _sees_everything(principal: Any) -> bool:
    return bool(principal.has_perm("checkpoints.view_thread"))


class InboxConsumer(sockets.EventConsumer):
    """`/ws/inbox/`: first an `inbox.sync` with the pending approval ids (a reconnecting client
    reconciles with it), then `approval.requested` / `approval.decided` events as they commit."""

    feed = "inbox"

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
        pending = await database_sync_to_async(_pending)(user)
        # A request that committed just before the sync may still be on its way through the
        # channel layer; the sync already names it, so its event is not sent a second time.
        self.synced = set(pending)
        await self.send_json({"type": "inbox.sync", "seq": 0, "thread": None, "data": {"pending": pending}})

    async def live_event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        if self.agent is not None and event.get("agent") != self.agent:
            return  # an agent key sees its own agent's approvals only
        if event["type"] == "approval.requested" and event["data"].get("approval") in self.synced:
            self.synced.discard(event["data"]["approval"])
            return
        await self.send_json({key: event[key] for key in ("type", "seq", "thread", "data")})
