"""Websocket authentication by agent key (`Authorization: Bearer qs_...`), ahead of the session."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from quicksave_agents.auth import AgentPrincipal
from quicksave_agents.keys import KEY_PREFIX, find_agent_key


class AgentKeyAuthMiddleware:
    """Sets scope["user"] to the agent when the handshake carries a valid key; a bad key is anonymous."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers", []))
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme == "Bearer" and token.startswith(KEY_PREFIX):
            key = await database_sync_to_async(find_agent_key)(token.strip())
            if key is not None:
                scope = {**scope, "user": AgentPrincipal(key)}
            else:
                from django.contrib.auth.models import AnonymousUser

                scope = {**scope, "user": AnonymousUser()}
        return await self.inner(scope, receive, send)
