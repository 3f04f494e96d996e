"""Approval requests: a suspended high-risk step waiting for a person's decision."""

from __future__ import annotations

from django.conf import settings
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
    # The decision: approved args (the edited ones when a reviewer changed them), the
    # reviewer's comment (required to reject), who and when. Empty while pending.
    decided_args = SealedJSONField(null=True, blank=True, bind=("pk",))
    args_edited = models.BooleanField(default=False)
    comment = models.TextField(blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
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
    def unreadable(self) -> str:
        """Why this request's sealed arguments do not open ("" when they do): the row was altered, or
        its thread's data key no longer unwraps. Pages and the API show such a request as unreadable
        instead of failing for everyone."""
        return unreadable(self, "args", "decided_args")
