"""Reads pages and the API share: the approvals assigned to a person, who voted on them, the agents
blocked on a person, policies with their versions, rules with how many requests each approved,
what the agent did next after a decision, and what each thread of a list waits on or ended with."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.contrib.auth.models import User
from django.contrib.postgres.expressions import ArraySubquery
from django.db.models import Count, Exists, JSONField, Min, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.db.models.functions import JSONObject, Left

from approvals.models import (
    ApprovalKind,
    ApprovalPolicy,
    ApprovalRequest,
    ApprovalStatus,
    ApprovalVote,
    AutoApproveRule,
    DeciderRole,
    PolicyVersion,
    Quorum,
    Resolution,
    VoteDecision,
)
from checkpoints.models import Checkpoint, Thread
from quicksave.roles import ADMIN, REVIEWER


def assigned_to(approvals: QuerySet[ApprovalRequest], user: User) -> QuerySet[ApprovalRequest]:
    """Of `approvals`, those `user` may decide and has not voted on: their policy names the person
    (by role, group or name; its escalation group once escalated), or names nobody. SQL only, no
    row read here (the same test as `policies.is_decider`, which decides; this one lists). The
    thread's starter stays assigned: they may still reject."""
    if not user.has_perm("checkpoints.decide_approval"):
        return approvals.none()
    groups = user.groups.values("pk")
    named_groups = PolicyVersion.groups.through.objects.filter(policyversion_id=OuterRef("policy_id"))
    named_users = PolicyVersion.users.through.objects.filter(policyversion_id=OuterRef("policy_id"))
    anyone = Q(policy__isnull=True) | Q(policy__role="", has_groups=False, has_users=False)
    named = (
        _by_role(user)
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


def _by_role(user: User) -> Q:
    """Policies whose role `user` holds (as `role_of` reads it: a superuser is an admin), asked in
    the query itself rather than read first: the person's roles are groups by name."""
    if user.is_superuser:
        return Q(policy__role__in=[DeciderRole.REVIEWER, DeciderRole.ADMIN])
    memberships = User.groups.through.objects.filter(user_id=user.pk)
    reviews = Exists(memberships.filter(group__name__in=[REVIEWER, ADMIN]))
    administers = Exists(memberships.filter(group__name=ADMIN))
    return (Q(policy__role=DeciderRole.REVIEWER) & reviews) | (Q(policy__role=DeciderRole.ADMIN) & administers)


@dataclass(frozen=True)
class Blocked:
    """An agent with threads waiting on a person: how many, and since when the longest has waited."""

    agent: str
    threads: int
    since: datetime


@dataclass(frozen=True)
class Waiting:
    """What waits among some approvals, per agent: every agent with an approval among them (by
    name), those blocked on a person (longest wait first) and how many approvals are pending."""

    agents: list[str]
    blocked: list[Blocked]
    pending: int


def waiting_by_agent(approvals: QuerySet[ApprovalRequest]) -> Waiting:
    """The agents of `approvals` and what of theirs is pending: one query, grouped by agent."""
    pending = Q(status=ApprovalStatus.PENDING)
    rows = list(
        approvals.order_by()
        .values("thread__agent__name")
        .annotate(
            approvals=Count("pk", filter=pending),
            threads=Count("thread_id", distinct=True, filter=pending),
            since=Min("created_at", filter=pending),
        )
        .order_by("thread__agent__name")
    )
    blocked = [
        Blocked(agent=row["thread__agent__name"], threads=row["threads"], since=row["since"])
        for row in rows
        if row["approvals"]
    ]
    return Waiting(
        agents=[row["thread__agent__name"] for row in rows],
        blocked=sorted(blocked, key=lambda item: item.since),  # stable: agents waiting as long by name
        pending=sum(row["approvals"] for row in rows),
    )


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


def with_next_checkpoint(approvals: QuerySet[ApprovalRequest]) -> QuerySet[ApprovalRequest]:
    """`approvals` annotated with the id, seq and label of their `next_checkpoint`: the first one
    written after the decision on the branch of the checkpoint the agent waited at, which is where
    its resume run goes on (None while pending, or until the agent writes again). No query of its
    own: index probes on the (thread, branch, seq) key within the approvals' query."""
    later = Checkpoint.objects.filter(
        thread_id=OuterRef("thread_id"),
        branch_id=OuterRef("checkpoint__branch_id"),
        seq__gt=OuterRef("checkpoint__seq"),
        created_at__gte=OuterRef("decided_at"),
    ).order_by("seq")
    return approvals.annotate(
        next_checkpoint_id=Subquery(later.values("pk")[:1]),
        next_checkpoint_seq=Subquery(later.values("seq")[:1]),
        next_checkpoint_label=Subquery(later.values("label")[:1]),
    )


@dataclass(frozen=True)
class Outcome:
    """What a thread of the list waits on (`pending`) or how its latest approval ended."""

    approval: UUID
    action: str
    pending: bool
    label: str  # "Awaiting approval", "Approved", "Rejected", "Expired", "In doubt"...
    tone: str  # a status-* class: running, waiting_for_approval, completed, failed, cancelled, paused
    by: str = ""
    comment: str = ""
    at: datetime | None = None


_OUTCOME_TONES = {
    ApprovalStatus.APPROVED: "completed",
    ApprovalStatus.REJECTED: "failed",
    ApprovalStatus.EXPIRED: "paused",
    ApprovalStatus.CANCELLED: "cancelled",
    ApprovalStatus.RESOLVED: "completed",
}


def next_checkpoint(approval: ApprovalRequest) -> Checkpoint | None:
    """The checkpoint `approval`'s agent wrote next after the decision (as `with_next_checkpoint`)."""
    if approval.decided_at is None:
        return None
    waited_at = approval.checkpoint
    later = Checkpoint.objects.defer("payload").filter(
        thread_id=approval.thread_id, branch_id=waited_at.branch_id, seq__gt=waited_at.seq,
        created_at__gte=approval.decided_at,
    )  # fmt: skip
    return later.order_by("seq").first()


def with_voters(approvals: QuerySet[ApprovalRequest]) -> QuerySet[ApprovalRequest]:
    """`approvals` annotated with the names of who approved and who rejected so far, in the order
    they voted, read with `quorum_of`: subqueries in the approvals' own query, no query of its own."""

    def voters(decision: str) -> ArraySubquery:
        votes = ApprovalVote.objects.filter(approval_id=OuterRef("pk"), decision=decision).order_by("created_at", "id")
        return ArraySubquery(votes.values("user__username"))

    return approvals.annotate(approved_by=voters(VoteDecision.APPROVE), rejected_by=voters(VoteDecision.REJECT))


def quorum_of(approval: ApprovalRequest) -> Quorum:
    """The quorum of an approval read through `with_voters` (with its `policy`)."""
    return Quorum.under(
        approval.policy,
        approved_by=getattr(approval, "approved_by", []),
        rejected_by=getattr(approval, "rejected_by", []),
    )


# Characters of a decision's comment the thread list keeps (in a title).
OUTCOME_COMMENT_CHARS = 300


def with_outcome(threads: QuerySet[Thread]) -> QuerySet[Thread]:
    """`threads` annotated with `latest_approval`: their newest approval or in-doubt call (the one
    pending, if any: a thread waits on one at a time) as a JSON object, read with `outcome_of`.
    A subquery in the threads' own query, on the approvals' thread index: no query of its own."""
    latest = (
        ApprovalRequest.objects.filter(thread_id=OuterRef("pk"))
        .order_by("-created_at", "-id")
        .values(
            summary=JSONObject(
                id="id", kind="kind", action="action", status="status", resolution="resolution",
                args_edited="args_edited", comment=Left("comment", OUTCOME_COMMENT_CHARS),
                decided_at="decided_at", created_at="created_at",
                decided_by__username="decided_by__username", rule__name="rule__name",
            )
        )[:1]
    )  # fmt: skip
    return threads.annotate(latest_approval=Subquery(latest, output_field=JSONField()))


def outcome_of(thread: Thread) -> Outcome | None:
    """What a thread read through `with_outcome` waits on, or how its newest approval ended."""
    row = getattr(thread, "latest_approval", None)
    if not isinstance(row, dict):
        return None
    for name in ("decided_at", "created_at"):
        row[name] = datetime.fromisoformat(row[name]) if row.get(name) else None
    row["id"] = UUID(str(row["id"]))
    return _outcome(row)


def _outcome(row: dict[str, Any]) -> Outcome:
    status = ApprovalStatus(row["status"])
    if status == ApprovalStatus.PENDING:
        label = "In doubt" if row["kind"] == ApprovalKind.IN_DOUBT else "Awaiting approval"
        return Outcome(approval=row["id"], action=row["action"], pending=True, label=label,
                       tone="waiting_for_approval", at=row["created_at"])  # fmt: skip
    if status == ApprovalStatus.RESOLVED:
        label = f"In doubt: {Resolution(row['resolution']).label.lower()}" if row["resolution"] else status.label
    elif status == ApprovalStatus.APPROVED and row["args_edited"]:
        label = "Approved with edits"
    else:
        label = status.label
    by = row["decided_by__username"] or (f"rule “{row['rule__name']}”" if row["rule__name"] else "")
    tone = _OUTCOME_TONES.get(status, "")
    return Outcome(approval=row["id"], action=row["action"], pending=False, label=label, tone=tone, by=by,
                   comment=row["comment"] or "", at=row["decided_at"])  # fmt: skip
