"""DRF authentication by agent key: `Authorization: Bearer qs_...`."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from audit.trail import client_address
from quicksave import throttle
from quicksave_agents.keys import KEY_PREFIX, find_agent_key
from quicksave_agents.models import Agent, AgentKey


class AgentPrincipal:
    """The request.user of a call made with an agent key: an agent, not a person."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False
    pk = None

    def __init__(self, key: AgentKey) -> None:
        self.key = key
        self.agent: Agent = key.agent

    def __str__(self) -> str:
        return f"agent:{self.agent.name}"

    def has_perm(self, perm: str, obj: Any = None) -> bool:
        return False


class AuthenticationThrottled(exceptions.Throttled):
    """429 for an address past QUICKSAVE_AUTH_FAILURES_PER_MINUTE failed keys (quicksave/throttle.py)."""

    default_detail = "Too many failed authentications from your address."

    def __init__(self, wait: int) -> None:
        super().__init__(wait)  # the message ends "Expected available in N seconds."; Retry-After says N too
        self.extra = {"retry_after": wait}


class AgentKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[AgentPrincipal, AgentKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme != self.keyword:
            return None
        token = token.strip()
        if not token.startswith(KEY_PREFIX):
            return None  # not ours: leave it to another authenticator
        key = find_agent_key(token)
        if key is None:
            wait = throttle.note_failure(client_address(request))
            if wait is not None:
                raise AuthenticationThrottled(wait)
            raise exceptions.AuthenticationFailed("The API key is unknown or has been revoked.")
        return AgentPrincipal(key), key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class AgentKeyScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]  # untyped base
    """Documents agent keys in /api/schema/ as an HTTP bearer scheme."""

    target_class = AgentKeyAuthentication
    name = "agentKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "An agent key: `Bearer qs_<prefix>_<secret>`."}
