"""The audit trail: one entry per human action, written in the same transaction as the action."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.http import HttpRequest

from approvals.models import AuditEntry
from checkpoints.models import Thread


def client_address(request: HttpRequest | None) -> str | None:
    """The caller's address as the server saw it (behind a proxy, configure it to set REMOTE_ADDR)."""
    if request is None:
        return None
    return request.META.get("REMOTE_ADDR") or None


def record(
    *,
    actor: User | None,
    action: str,
    target_type: str,
    target_id: Any,
    thread: Thread | None = None,
    reason: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    address: str | None = None,
) -> AuditEntry:
    return AuditEntry.objects.create(
        actor=actor, actor_name=actor.get_username() if actor else "quicksave", action=action,
        target_type=target_type, target_id=str(target_id), thread=thread, reason=reason,
        before=before or {}, after=after or {}, address=address,
    )  # fmt: skip
