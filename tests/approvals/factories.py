"""Small factories for approval tests: a thread waiting on a request, a policy, a group of people."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, User

from approvals import policies
from approvals.models import ApprovalRequest, PolicyVersion
from approvals.services import request_approval
from checkpoints import storage
from quicksave_agents.keys import get_or_create_agent
from tests.conftest import person


def waiting(
    *,
    agent: str = "travel",
    action: str = "book_flight",
    args: Any = None,
    risk: str = "high",
    started_by: User | None = None,
    expires_at: Any = None,
) -> ApprovalRequest:
    """A new thread of `agent`, suspended on a request to run `action(args)`."""
    thread, _ = storage.create_thread(agent=get_or_create_agent(name=agent), started_by=started_by)
    checkpoint = storage.append_checkpoint(thread=thread, parent=None, state={"step": action}, label=action,
                                           status="waiting_for_approval")  # fmt: skip
    return request_approval(thread=thread, checkpoint=checkpoint, action=action,
                            args={"flight": "SK123", "price": 420} if args is None else args, risk=risk,
                            expires_at=expires_at)  # fmt: skip


def group_of(name: str, *members: User) -> Group:
    group, _ = Group.objects.get_or_create(name=name)
    group.user_set.add(*members)
    return group


def policy(*, agent: str | None = "travel", action: str = "book_flight", actor: User | None = None,
           **terms: Any) -> PolicyVersion:  # fmt: skip
    """A live policy, made by an admin (`actor`, else a new one named ada)."""
    actor = actor or User.objects.filter(username="ada").first() or person("ada", "admin")
    return policies.create_policy(agent=get_or_create_agent(name=agent) if agent else None, action=action,
                                  terms=policies.Terms(**terms), actor=actor)  # fmt: skip
