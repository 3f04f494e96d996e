"""Sharing memory between agents: a person grants an agent every namespace under a prefix, or
revokes that grant; both are audited, with the reason the person gives."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import trail
from memory.errors import MemoryStoreError
from memory.models import NamespaceGrant
from memory.paths import Path, dotted, namespace_path
from quicksave_agents.models import Agent


class GrantExists(MemoryStoreError):
    code = "already_granted"
    status = 409


class GrantRevoked(MemoryStoreError):
    code = "already_revoked"
    status = 409


def grant_namespace(
    *, prefix: Path | list[str], agent: Agent, user: User, reason: str, address: str | None = None
) -> NamespaceGrant:
    """Let `agent` read and write every namespace under `prefix` (those there now and those made
    later, whoever made them)."""
    path = namespace_path(prefix, field="prefix")
    try:
        with transaction.atomic():
            grant = NamespaceGrant.objects.create(prefix=list(path), agent=agent, reason=reason, granted_by=user)
            trail.record(
                actor=user, action="memory.grant", target_type="memory_namespace", target_id=dotted(path)[:64],
                reason=reason, after={"prefix": list(path), "agent": agent.name, "grant": grant.pk}, address=address,
            )  # fmt: skip
    except IntegrityError:
        raise GrantExists(
            f"Agent '{agent.name}' already holds a grant of {dotted(path)}.",
            detail={"prefix": list(path), "agent": agent.name},
        ) from None
    return grant


def revoke_grant(*, grant: NamespaceGrant, user: User, reason: str, address: str | None = None) -> NamespaceGrant:
    """End a grant at once: the agent's next read or write of those namespaces is refused."""
    with transaction.atomic():
        locked = NamespaceGrant.objects.select_for_update().select_related("agent").get(pk=grant.pk)
        if locked.revoked_at is not None:
            raise GrantRevoked(
                f"This grant was revoked at {locked.revoked_at:%Y-%m-%d %H:%M} UTC.",
                detail={"revoked_at": locked.revoked_at.isoformat()},
            )
        locked.revoked_at, locked.revoked_by, locked.revoke_reason = timezone.now(), user, reason
        locked.save(update_fields=["revoked_at", "revoked_by", "revoke_reason"])
        trail.record(
            actor=user, action="memory.revoke", target_type="memory_namespace",
            target_id=dotted(tuple(locked.prefix))[:64], reason=reason,
            before={"prefix": locked.prefix, "agent": locked.agent.name, "grant": locked.pk}, address=address,
        )  # fmt: skip
    return locked
