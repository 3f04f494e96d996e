"""The audit trail: one entry per human action, written in the same transaction as the action."""

from __future__ import annotations

import getpass
import ipaddress
import os
from typing import Any

from django.contrib.auth.models import User
from django.http import HttpRequest

from approvals.models import AuditEntry
from checkpoints.models import Thread


def client_address(request: HttpRequest | None) -> str | None:
    """The caller's address as the server saw it (behind a proxy, configure it to set REMOTE_ADDR),
    or None when that is no IP address: a server that trusts a proxy's X-Forwarded-For takes
    whatever the header says, and a made-up one must not fail the action it would audit."""
    if request is None:
        return None
    address = request.META.get("REMOTE_ADDR") or ""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


def cli_actor_name() -> str:
    """Who ran a management command, as the audit trail names them: `cli:<os user>`."""
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):  # no login name and no passwd entry (a bare container)
        return f"cli:uid-{os.getuid()}"


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
    actor_name: str | None = None,
) -> AuditEntry:
    """Write one entry. `actor_name` names an actor who is not a user (`cli:<os user>`);
    with neither, the actor is Quicksave itself."""
    name = actor_name or (actor.get_username() if actor else "quicksave")
    return AuditEntry.objects.create(
        actor=actor, actor_name=name, action=action,
        target_type=target_type, target_id=str(target_id), thread=thread, reason=reason,
        before=before or {}, after=after or {}, address=address,
    )  # fmt: skip
