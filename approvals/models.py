"""Approval requests: a suspended high-risk step waiting for a person's decision; the votes people
cast on it; the approval policies that say who decides and how many must agree; and the
auto-approve rules that decide the routine requests at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.utils import timezone
from django.utils.functional import cached_property

from checkpoints.fields import SealedJSONField, unreadable
from checkpoints.ids import new_id


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"
    RESOLVED = "resolved", "Resolved"  # an in-doubt call a person answered


class ApprovalKind(models.TextChoices):
    APPROVAL = "approval", "Approval"  # the agent asks before it acts
    IN_DOUBT = "in_doubt", "In-doubt call"  # a call may have run without a recorded result


class Resolution(models.TextChoices):
    """A person's answer on an in-doubt call."""

    HAPPENED = "happened", "It happened"  # record this result; the agent goes on with it
    NOT_HAPPENED = "not_happened", "It did not happen"  # the agent runs the call
    FAIL = "fail", "Fail the thread"


class Risk(models.TextChoices):
    LOW = "low", "Low"
    MEDIUM = "medium", "Medium"
    HIGH = "high", "High"


@dataclass(frozen=True)
class Quorum:
    """Who approved and rejected a request so far, of how many needed (1 and 1 without a policy)."""

    approvals_needed: int = 1
    rejections_needed: int = 1
    approved_by: list[str] = field(default_factory=list)
    rejected_by: list[str] = field(default_factory=list)

    @property
    def counts(self) -> bool:
        """Whether the request needs several votes, or has some: then pages show the quorum."""
        return self.approvals_needed > 1 or self.rejections_needed > 1 or bool(self.approved_by or self.rejected_by)

    @classmethod
    def under(cls, policy: PolicyVersion | None, *, approved_by: list[str], rejected_by: list[str]) -> Quorum:
        """The quorum of a request filed under `policy` (None: one person decides), with these votes."""
        return cls(
            approvals_needed=policy.approvals_needed if policy else 1,
            rejections_needed=policy.rejections_needed if policy else 1,
            approved_by=approved_by,
            rejected_by=rejected_by,
        )


class ApprovalRequest(models.Model):
    """What the agent wants to do, why, and — once decided — who decided what, and when.

    An `in_doubt` request is no question the agent asked: a replay found a call started by an attempt
    that died before recording its result (`tool_call`), and a person says whether it happened.
    Written only through approvals.services; exactly one decision ever wins.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    kind = models.CharField(max_length=16, choices=ApprovalKind.choices, default=ApprovalKind.APPROVAL)
    tool_call = models.ForeignKey(
        "agents.ToolCall", null=True, blank=True, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    resolution = models.CharField(max_length=16, choices=Resolution.choices, blank=True)
    thread = models.ForeignKey("checkpoints.Thread", on_delete=models.CASCADE, related_name="approvals")
    checkpoint = models.ForeignKey(
        "checkpoints.Checkpoint", on_delete=models.CASCADE, related_name="approvals", db_index=False
    )
    action = models.CharField(max_length=200)
    args = SealedJSONField(default=dict, bind=("pk",))
    message = models.TextField(blank=True)
    risk = models.CharField(max_length=8, choices=Risk.choices, default=Risk.HIGH)
    expires_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    # The policy version in force when the request was filed: a later change of the policy does not
    # move the goalposts of a request already waiting. NULL: no policy, any reviewer decides alone.
    policy = models.ForeignKey(
        "approvals.PolicyVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    # Set when the deadline passed and the policy handed the request to its escalation group.
    escalated_at = models.DateTimeField(null=True, blank=True)
    # The decision: approved args (the edited ones when a reviewer changed them), the
    # reviewer's comment (required to reject), who and when. Empty while pending.
    decided_args = SealedJSONField(null=True, blank=True, bind=("pk",))
    args_edited = models.BooleanField(default=False)
    comment = models.TextField(blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    # The auto-approve rule that decided the request, when no person did.
    rule = models.ForeignKey(
        "approvals.AutoApproveRule", null=True, blank=True, on_delete=models.PROTECT, related_name="approvals"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at"]
        indexes = [
            models.Index(fields=["status", "created_at"], name="approval_inbox"),
            models.Index(fields=["expires_at"], name="approval_deadline", condition=models.Q(status="pending")),
        ]
        constraints = [
            # A thread waits on at most one decision at a time.
            models.UniqueConstraint(
                fields=["thread"], condition=models.Q(status="pending"), name="one_pending_approval_per_thread"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} ({self.status})"

    @cached_property
    def quorum(self) -> Quorum:
        """How far the request is towards its outcome under its policy (reads `policy` and
        `votes__user`: a list select- and prefetches them)."""
        votes = list(self.votes.all())
        return Quorum.under(
            self.policy,
            approved_by=[vote.user.get_username() for vote in votes if vote.decision == VoteDecision.APPROVE],
            rejected_by=[vote.user.get_username() for vote in votes if vote.decision == VoteDecision.REJECT],
        )

    @cached_property
    def unreadable(self) -> str:
        """Why this request's sealed arguments do not open ("" when they do): the row was altered, or
        its thread's data key no longer unwraps. Pages and the API show such a request as unreadable
        instead of failing for everyone."""
        return unreadable(self, "args", "decided_args")


class VoteDecision(models.TextChoices):
    APPROVE = "approve", "Approve"
    REJECT = "reject", "Reject"


class ApprovalVote(models.Model):
    """One person's approve or reject on a pending request. A request under a policy that needs
    N approvals collects votes until N approve (or enough reject); each person votes once.
    Written only through approvals.services.decide, under the request's row lock."""

    approval = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="votes")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    decision = models.CharField(max_length=8, choices=VoteDecision.choices)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["approval", "user"], name="one_vote_per_person")]

    def __str__(self) -> str:
        return f"{self.decision} on {self.approval_id}"


class DeciderRole(models.TextChoices):
    REVIEWER = "reviewer", "Reviewers and admins"
    ADMIN = "admin", "Admins only"


class AtDeadline(models.TextChoices):
    """What happens to a request still waiting at its deadline."""

    REJECT = "reject", "Reject it"
    APPROVE_LOW_RISK = "approve_low_risk", "Approve it if its risk is low, else reject it"
    ESCALATE = "escalate", "Escalate it to another group"


class ApprovalPolicy(models.Model):
    """Which requests a policy governs: one agent's (no agent: every agent's) requests for one
    action (blank: any action). What it says lives in its versions; the newest is in force.
    Written only through approvals.policies."""

    agent = models.ForeignKey(
        "agents.Agent", null=True, blank=True, on_delete=models.CASCADE, related_name="approval_policies"
    )
    action = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # A retired policy governs nothing new; its versions stay for the requests bound to them.
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["agent__name", "action", "id"]
        verbose_name_plural = "approval policies"
        permissions = [("manage_policies", "Can change approval policies and auto-approve rules")]
        constraints = [
            # One live policy per (agent, action); two constraints, since the agent may be NULL
            # (the default policy) and PostgreSQL 14 has no NULLS NOT DISTINCT.
            models.UniqueConstraint(
                fields=["agent", "action"], condition=models.Q(retired_at__isnull=True, agent__isnull=False),
                name="one_live_policy_per_agent_action",
            ),
            models.UniqueConstraint(
                fields=["action"], condition=models.Q(retired_at__isnull=True, agent__isnull=True),
                name="one_live_default_policy_per_action",
            ),
        ]  # fmt: skip

    def __str__(self) -> str:
        return f"{self.agent.name if self.agent else 'any agent'} · {self.action or 'any action'}"


class PolicyVersion(models.Model):
    """What a policy says, as of one change: who may decide, how many must agree, and what happens
    at the deadline. Never changed once written; a change of the policy writes the next version."""

    policy = models.ForeignKey(ApprovalPolicy, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    # Who may decide: people with this role, members of these groups and these people (any of
    # them); none of the three set: anyone with the reviewer role. Deciding always needs the
    # reviewer role as well.
    role = models.CharField(max_length=16, choices=DeciderRole.choices, blank=True)
    groups = models.ManyToManyField(Group, blank=True, related_name="+")
    users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="+")
    approvals_needed = models.PositiveSmallIntegerField(default=1)
    # 1: any rejection rejects. More: a rejection only counts once this many people rejected.
    rejections_needed = models.PositiveSmallIntegerField(default=1)
    starter_may_approve = models.BooleanField(
        default=False, help_text="Whether the person who started the thread may approve its requests."
    )
    # The deadline: this long after the request (or the agent's own `expires_at`, if sooner).
    deadline_minutes = models.PositiveIntegerField(null=True, blank=True)
    at_deadline = models.CharField(max_length=16, choices=AtDeadline.choices, default=AtDeadline.REJECT)
    escalate_to = models.ForeignKey(Group, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    # After an escalation, the group has this long before the request is rejected (NULL: no limit).
    escalation_minutes = models.PositiveIntegerField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["policy", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["policy", "version"], name="policy_version_unique"),
            models.CheckConstraint(
                condition=models.Q(approvals_needed__gte=1, rejections_needed__gte=1), name="policy_quorum_positive"
            ),
            models.CheckConstraint(
                condition=~models.Q(at_deadline="escalate", escalate_to__isnull=True), name="policy_escalates_somewhere"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.policy} v{self.version}"


class AutoApproveRule(models.Model):
    """Approve an agent's (no agent: any agent's) requests for `action` at once when their args
    pass `args_schema` and every one of `conditions`, their risk is at most `max_risk`, and the
    rule is neither expired nor revoked. Written only through approvals.rules."""

    name = models.CharField(max_length=100)
    agent = models.ForeignKey(
        "agents.Agent", null=True, blank=True, on_delete=models.CASCADE, related_name="auto_approve_rules"
    )
    action = models.CharField(max_length=200)
    # [{"path": JSON Pointer into the args, "op": eq|ne|lt|le|gt|ge|in, "value": JSON}], all must hold.
    conditions = models.JSONField(default=list, blank=True)
    args_schema = models.JSONField(null=True, blank=True, help_text="A JSON Schema the args must satisfy.")
    max_risk = models.CharField(max_length=8, choices=Risk.choices, default=Risk.LOW)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    revoke_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # What a new request's check reads: the live rules for its action.
            models.Index(fields=["action"], name="auto_approve_live", condition=models.Q(revoked_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return self.name

    def is_live(self, now: datetime | None = None) -> bool:
        now = now or timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)
