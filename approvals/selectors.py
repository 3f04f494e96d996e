"""Reads pages and the API share: the approvals assigned to a person, the agents blocked on a
person, policies with their versions, rules with how many requests each approved."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import User
from django.db.models import Count, Exists, Min, OuterRef, Prefetch, Q, QuerySet

from approvals.models import (
    ApprovalPolicy,
    ApprovalRequest,
    ApprovalStatus,
    ApprovalVote,
    AutoApproveRule,
    DeciderRole,
    PolicyVersion,
)
from quicksave.roles import ADMIN, REVIEWER, role_of


def assigned_to(approvals: QuerySet[ApprovalRequest], user: User) -> QuerySet[ApprovalRequest]:
    """Of `approvals`, those `user` may decide and has not voted on: their policy names the person
    (by role, group or name; its escalation group once escalated), or names nobody. SQL only, no
    row read here (the same test as `policies.is_decider`, which decides; this one lists). The
    thread's starter stays assigned: they may still reject."""
    if not user.has_perm("checkpoints.decide_approval"):
        return approvals.none()
    groups = user.groups.values("pk")
    roles = {ADMIN: [DeciderRole.REVIEWER, DeciderRole.ADMIN], REVIEWER: [DeciderRole.REVIEWER]}.get(
        role_of(user) or "", []
    )
    named_groups = PolicyVersion.groups.through.objects.filter(policyversion_id=OuterRef("policy_id"))
    named_users = PolicyVersion.users.through.objects.filter(policyversion_id=OuterRef("policy_id"))
    anyone = Q(policy__isnull=True) | Q(policy__role="", has_groups=False, has_users=False)
    named = (
        Q(policy__role__in=roles)
        | Exists(named_users.filter(user_id=user.pk))
        | Exists(named_groups.filter(group_id__in=groups))
        | Q(escalated_at__isnull=False, policy__escalate_to__in=groups)
    )
    voted = ApprovalVote.objects.filter(approval_id=OuterRef("pk"), user_id=user.pk)
    return (
        approvals.alias(has_groups=Exists(named_groups), has_users=Exists(named_users), voted=Exists(voted))
        .filter(anyone | named)
        .filter(voted=False)
    )


@dataclass(frozen=True)
class Blocked:
    """An agent with threads waiting on a person: how many, and since when the longest has waited."""

    agent: str
    threads: int
    since: datetime


def blocked_agents(approvals: QuerySet[ApprovalRequest]) -> list[Blocked]:
    """The agents whose threads wait on a pending approval among `approvals`, longest wait first: one query."""
    rows = (
        approvals.filter(status=ApprovalStatus.PENDING)
        .order_by()
        .values("thread__agent__name")
        .annotate(threads=Count("thread_id", distinct=True), since=Min("created_at"))
        .order_by("since")
    )
    return [Blocked(agent=row["thread__agent__name"], threads=row["threads"], since=row["since"]) for row in rows]


def policies_listed() -> QuerySet[ApprovalPolicy]:
    """Policies with every version prefetched newest first (`current_version` reads the first):
    four queries however many there are."""
    versions = (
        PolicyVersion.objects.order_by("-version")
        .select_related("created_by", "escalate_to", "policy__agent")
        .prefetch_related("groups", "users")
    )
    return ApprovalPolicy.objects.select_related("agent").prefetch_related(Prefetch("versions", queryset=versions))


def current_version(policy: ApprovalPolicy) -> PolicyVersion:
    """The version in force (of a policy from `policies_listed`)."""
    return next(iter(policy.versions.all()))


def rules_listed() -> QuerySet[AutoApproveRule]:
    """Rules with their people and how many requests each approved (`approved_count`)."""
    return AutoApproveRule.objects.select_related("agent", "created_by", "revoked_by").annotate(
        approved=Count("approvals")
    )


def approved_count(rule: AutoApproveRule) -> int:
    """How many requests a rule from `rules_listed` approved."""
    return int(getattr(rule, "approved", 0))
