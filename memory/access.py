"""Whose memory a caller sees: the one place the store, the API and the LangGraph store ask.

An agent uses the namespaces it owns (it wrote their first item) and those under a prefix a person
granted it (memory.sharing); a namespace it may not use is one that does not exist, as a foreign
thread is a 404. People with the viewer role read every namespace, admins write them; in-process
code that is no agent (the dashboard, a management command) sees everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.db import connection
from rest_framework.exceptions import PermissionDenied

from memory.spaces import Space
from quicksave_agents.auth import AgentPrincipal

VIEW = "memory.view_item"
WRITE = "memory.change_item"
SHARE = "memory.share_namespace"


@dataclass(frozen=True, slots=True)
class Scope:
    """The namespaces a caller may use: `agent_id`'s own and those granted to it, or (None) all."""

    agent_id: int | None = None

    @property
    def everything(self) -> bool:
        return self.agent_id is None


EVERYTHING = Scope()

_GRANTED = (
    "EXISTS (SELECT 1 FROM memory_namespacegrant g WHERE g.agent_id = %s AND g.revoked_at IS NULL "
    "AND {alias}.path[1:cardinality(g.prefix)] = g.prefix)"
)


def visible_sql(scope: Scope, alias: str = "n") -> tuple[str, list[Any]]:
    """A condition on namespace rows (`alias`) that holds for those the scope may use."""
    if scope.agent_id is None:
        return "TRUE", []
    return f"({alias}.agent_id = %s OR {_GRANTED.format(alias=alias)})", [scope.agent_id, scope.agent_id]


def may_use(scope: Scope, space: Space) -> bool:
    if scope.agent_id is None or space.agent_id == scope.agent_id:
        return True
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {_GRANTED.format(alias='n')} FROM memory_namespace n WHERE n.id = %s", [scope.agent_id, space.id]
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def scope_for_reading(principal: Any) -> Scope:
    """The scope of an API caller who reads memory; 403 for a person without the viewer role."""
    if isinstance(principal, AgentPrincipal):
        return Scope(principal.agent.pk)
    if getattr(principal, "is_authenticated", False) and principal.has_perm(VIEW):
        return EVERYTHING
    raise PermissionDenied("Reading memory needs an agent key or the viewer role.")


def scope_for_writing(principal: Any) -> Scope:
    """The scope of an API caller who writes memory: agents their own (and granted) namespaces,
    admins every namespace; 403 for anyone else."""
    if isinstance(principal, AgentPrincipal):
        return Scope(principal.agent.pk)
    if isinstance(principal, User) and principal.has_perm(WRITE):
        return EVERYTHING
    raise PermissionDenied("Writing memory needs an agent key or the admin role.")


def check_can_share(principal: Any) -> User:
    if not isinstance(principal, User) or not principal.has_perm(SHARE):
        raise PermissionDenied("Sharing memory between agents needs the admin role.")
    return principal
